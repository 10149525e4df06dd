"""Documents -> loglikelihood requests: lm-eval's tokenisation, rolling and strided windows, Arrow request tables, and
shards (the unit of work an actor scores, and what it sends back)."""
