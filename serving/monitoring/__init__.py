"""The service watching itself: its population, its counters, its memory.

``monitor`` keeps the recent admissions and their shift report against the export's reference;
``telemetry`` holds the Prometheus instruments of one app; ``malloc`` caps glibc's arenas and
hands free pages back. They import nothing else of ``serving``.
"""
