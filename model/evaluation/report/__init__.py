"""The page: text tables, figures and report.html, drawn from numbers ``model.evaluation.statistics`` computed.

``html_cells`` spells one number, interval, table or card as escaped HTML; ``formatting`` writes the
command lines' text tables; ``plots`` draws the PNG figures; ``report_summary`` the page's first
screen and its small-sample statements; ``report_html`` the whole self-contained page. They read
a report's numbers and the statistics' constants, and compute none of their own. This file
imports none of the modules.
"""
