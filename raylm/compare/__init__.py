"""Comparing finished runs and the report page: the stage after results, reading what earlier stages wrote.

find.py knows which outputs are runs, one reader module per kind of output (corpus_output, eval_output,
lmeval_output, sweep_output); scores.py reads a task's per-document values, and a corpus run's rows, from the
formats runs keep them in; pairing.py decides what pairs with what and which number a task or group reports,
corpus_pairing.py the same for corpus runs (bits per byte); statistics.py holds the paired statistics;
comparison.py pairs every run with the first of its kind; output.py prints and writes comparisons; page.py draws
the report. Each run is read once, into a Run.
"""
