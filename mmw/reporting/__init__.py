"""The reports mmw writes: one run's numbers and summary, a selection's report, ``reports/index.html`` (one
self-contained file) and the offline ``dvc plots`` page. A sweep's table files are :mod:`mmw.sweep.tables`'.

- :mod:`mmw.reporting.run`: one run's ``reports/metrics.json`` and ``dvc plots`` tables (stage ``aggregate``).
- :mod:`mmw.reporting.quality`: one run's ``reports/quality.json`` (stage ``quality``).
- :mod:`mmw.reporting.summary`: one run's ``reports/summary.md`` and tamper-resistance figure.
- :mod:`mmw.reporting.formats`: how numbers print, in every report.
- :mod:`mmw.reporting.selection`: a selection's Markdown report and size-quality figure (``mmw select``).
- :mod:`mmw.reporting.data`: reads a sweep's tables (``reports/sweeps/<name>/``) or a single run's
  ``reports/metrics.json`` and shapes them into what the page shows (the paper's table cells, figure data).
- :mod:`mmw.reporting.figures`: matplotlib figures, inlined into the page as SVG (no script, no network).
- :mod:`mmw.reporting.page`: the HTML page (Jinja2 template ``report.html.j2``).
- :mod:`mmw.reporting.dvc_template`: DVC's plots page template with Vega, Vega-Lite and vega-embed inlined.

Design and usage: docs/REPORT.md.
"""

#: The group that pools every task (metrics.json, quality.json and summary.md: ``all``, then each task).
OVERALL = "all"
