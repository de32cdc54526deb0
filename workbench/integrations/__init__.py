"""The workbench inside other trainers: ``workbench.integrations.trl`` (TRL's ``GRPOTrainer(rollout_func=...)``)."""
