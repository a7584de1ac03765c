"""The LitGPT adapter: ``litgpt finetune_lora|finetune|finetune_full|finetune_adapter|finetune_adapter_v2|pretrain``."""
