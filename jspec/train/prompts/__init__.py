"""The prompt corpus for drafter training (`jspec train prompts`): template and third-party-docs
prompts in twelve families, deduplicated and decontaminated. Entry point: build.build_corpus."""
