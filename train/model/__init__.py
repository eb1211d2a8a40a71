"""The model side of a run: what a model name is (source), loading and config overrides (load), tokenizer
training, the masked-only head, packing's attention masks, whole words from a vocabulary, and the masking
collator. Nothing here reads files of the run or parses options."""
