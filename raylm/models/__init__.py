"""The stage that loads models, below everything that uses one: what a model is (ModelSpec), loading it and its
tokenizer, which commit or contents it is (identity), and how long a context it takes."""
