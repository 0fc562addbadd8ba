"""rollwise: RL post-training of tool-using agents."""
