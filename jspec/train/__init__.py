"""Training learned drafters: data (prompts, target-regenerated token shards, grain loading),
drafter training and export."""
