"""Comparing finished runs and the report page: the stage after results, reading what earlier stages wrote.

find.py knows which outputs are runs, one reader module per kind of output (eval_output, lmeval_output,
sweep_output); scores.py reads a task's per-document values from the formats runs keep them in; pairing.py decides
what pairs with what and which number a task or group reports; statistics.py holds the paired statistics; output.py
prints and writes comparisons; page.py draws the report. Each run is read once, into a Run.
"""
