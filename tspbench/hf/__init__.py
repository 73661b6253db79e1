"""Hugging Face models in tspbench: config and weight conversion (convert.py), and `parallelize` (parallelize.py),
which shards a transformers Llama-family model with any scheme of the registry. Importing this package imports
no transformers; convert.py never does, parallelize.py only to read a model's config."""
