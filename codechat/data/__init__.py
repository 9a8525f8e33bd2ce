"""Data: source corpora, token shards and loaders."""
