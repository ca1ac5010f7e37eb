/* tessel/peft.h — Hugging Face peft adapter files of a LoRA run, and the
 * merged model (docs/peft.md).
 *
 *     if (ts_peft_export_adapter("runs/lora", "adapter") != TS_OK ||
 *         ts_peft_export_merged("runs/lora", "merged.safetensors") != TS_OK)
 *         fprintf(stderr, "%s\n", ts_last_error());
 *
 * `ckpt` is a checkpoint of a run trained with peft.lora.targets (a step-N
 * directory, or a run directory: its LATEST). The LoRA hyper-parameters
 * (alpha, use_rslora, dropout, peft.base) come from the run's config.yaml,
 * the directory above the checkpoint; r is checked against the tensors.
 *
 * Names: the tessel parameter W (e.g. "net.0.weight") with LoRA tensors
 * "W.lora_A" [r, in] and "W.lora_B" [out, r] is peft's module M = W without
 * its trailing ".weight" (W itself if it has none); its tensors are
 * "base_model.model.M.lora_A.weight" and "base_model.model.M.lora_B.weight",
 * the same shapes. Errors name the file and the tensor or key. */
#ifndef TESSEL_PEFT_H
#define TESSEL_PEFT_H

#include <stddef.h>
#include "tessel/status.h"

/* DIR/adapter_model.safetensors and DIR/adapter_config.json (DIR is made
 * if it does not exist; both files are replaced atomically). */
ts_status ts_peft_export_adapter(const char *ckpt, const char *dir);

/* A plain safetensors file of the merged model: every parameter of the
 * checkpoint, with W += s * B A folded into each patched weight (s = alpha
 * / r, or alpha / sqrt(r) with use_rslora) and the LoRA tensors removed. */
ts_status ts_peft_export_merged(const char *ckpt, const char *path);

/* The peft key of a LoRA tensor `name` ("W.lora_A" or "W.lora_B") into
 * out; 0 if name is not a LoRA tensor's or out is too small. */
int ts_peft_hf_key(const char *name, char *out, size_t n);

/* What the peft pass added a parameter `name` as: 1 a LoRA tensor
 * ("W.lora_A", "W.lora_B"), 2 an adapter's ("W.adapter_down",
 * "W.adapter_down_bias", "W.adapter_up", "W.adapter_up_bias"), 0 neither
 * (a base parameter). */
int ts_peft_param_kind(const char *name);

#endif
