"""Result records: one schema for measured, estimated and modelled runs, the JSONL store and the terminal
tables."""
