"""Reading records, never running them: scorecards, the HTML report and its figures, gates,
``compare``, and the loggers. Nothing here imports the engine.
"""
