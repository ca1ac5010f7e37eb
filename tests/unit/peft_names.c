/* The peft key of a LoRA tensor (tessel/peft.h): module = the weight's
 * name without ".weight", the whole name when it has none; anything that
 * is not a LoRA tensor, or does not fit the buffer, has no key. */
#include <string.h>
#include "check.h"
#include "tessel/peft.h"

static void key(const char *name, const char *want) {
    char out[128] = "";
    int ok = ts_peft_hf_key(name, out, sizeof out);
    if (want)
        CHECK(ok && !strcmp(out, want), "%s -> '%s', expected '%s'", name, out, want);
    else
        CHECK(!ok, "%s has no peft key, got '%s'", name, out);
}

int main(void) {
    key("net.0.weight.lora_A", "base_model.model.net.0.lora_A.weight");
    key("net.0.weight.lora_B", "base_model.model.net.0.lora_B.weight");
    key("h.3.attn.c_attn.weight.lora_A", "base_model.model.h.3.attn.c_attn.lora_A.weight");
    key("lin1.lora_B", "base_model.model.lin1.lora_B.weight"); /* no ".weight" */
    key(".weight.lora_A", "base_model.model..weight.lora_A.weight");
    key("net.0.weight", NULL);
    key("net.0.weight.lora_C", NULL);
    key("lora_A", NULL);
    char small[20];
    CHECK(!ts_peft_hf_key("net.0.weight.lora_A", small, sizeof small), "too small a buffer");
    return check_summary("unit/peft_names");
}
