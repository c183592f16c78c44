"""`kunlun-fleet upgrade`'s controller side: the report of one upgrade (report.py:
results.json, report.md, report.html)."""
