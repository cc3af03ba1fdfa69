"""The service watching itself: its population, its counters, its memory.

``monitor`` keeps the recent admissions and their shift report against the export's reference;
``outcome_store`` keeps predictions until their outcomes arrive (SQLite, off unless configured) and
``outcome_monitor`` reports realized beside expected performance over them, with the O/E alarm;
``telemetry`` holds the Prometheus instruments of one app; ``malloc`` caps glibc's arenas and
hands free pages back. They import nothing else of ``serving``.
"""
