"""The benchmark report, in three steps: records.py reads the JSON records into data, tables.py writes
the Markdown and plots.py the figures; model.py holds the cost model both use. bench/report.py runs
them."""
