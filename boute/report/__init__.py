"""``boute report``: one self-contained HTML page for an experiment of the tracking DB.

:mod:`~boute.report.gather` reads the DB into a typed :class:`~boute.report.model.Report` (pure functions
but for the one read), :mod:`~boute.report.figures` and :mod:`~boute.report.diagram` draw it,
:mod:`~boute.report.render` writes the page, :mod:`~boute.report.publish` is the edge the commands call
(open the store, write the file atomically, record a verification). The layer sits above the optimiser:
it reads what a search recorded and the rules that made it (objectives, statuses, the clock's phases).
"""
