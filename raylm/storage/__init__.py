"""Where outputs live: a local directory or a filesystem URI such as s3://bucket/run (location), writing there
without a reader ever seeing half a file (atomic), one writer per directory (lock), and which files there raylm
wrote and so may replace or delete (ownership).

The ground floor: every stage that writes imports it, and it imports no stage.
"""
