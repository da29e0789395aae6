"""Known failures of the ONNX backend suite under aotc: case id -> why it fails. The tests of these
cases are strict xfails (tests/test_backend_suite.py): fixing one makes its test fail until the entry
is removed. Regenerate docs/ops.md (tools/ops_table.py) after changing this file."""

from __future__ import annotations

STRING = "string tensors: aotc compiles numeric tensors only (aotc/ir/dtypes.py lists the element types)"
BF16_ULP = ("bfloat16 chains: aotc rounds to bfloat16 after each op like the reference, but Softmax computes "
            "in float32 and rounds once where the reference rounds each step (x - max, exp, sum, divide) to "
            "bfloat16; results differ by one bfloat16 ulp (0.4-0.8% relative), which rtol 1e-3 does not allow")
TRAINING = "training-mode Dropout draws random masks; aotc compiles inference only and rejects it"
BN_TRAINING = ("BatchNormalization in training mode (batch statistics, running-mean outputs) is not "
               "supported; aotc folds inference-mode BatchNormalization only")
FP16_ULP = ("float16 chains: aotc rounds to float16 after each op like the reference, but in another "
            "order (fused loops, accumulators); results differ by one float16 ulp (~1e-3 relative), "
            "which the suite's rtol of 1e-3 does not allow")

ATTENTION_BF16 = ("bfloat16 Attention runs widened to float32 (aotc/passes/widen.py) and rounds once, where "
                  "the reference rounds each step to bfloat16 (scores, exp, the softmax sum one addition at a "
                  "time); results differ by one bfloat16 ulp (0.4-0.8% relative), which rtol 1e-3 does not allow")
FFT_NOISE = ("the expected imaginary parts hold float32 FFT rounding noise (1.9e-7 where the exact "
             "transform of the given input is 3e-15), above the suite's atol of 1e-7; aotc sums in double")

IF_OPTIONAL = ("the If's condition is a graph input, so only known at run time, and its branches give an empty "
               "optional and a sequence: a compiled library has a fixed set of outputs, so aotc needs an "
               "optional's presence known at compile time (frontends/sequences.py refuses it by name)")

EXPECTED_FAILURES: dict[str, str] = {
    "test_if_opt": IF_OPTIONAL,
    "test_dft_inverse": FFT_NOISE,
    "test_dft_inverse_opset19": FFT_NOISE,
    "test_attention_3d_causal_bf16": ATTENTION_BF16,
    "test_attention_3d_causal_bf16_expanded": BF16_ULP,
    "test_attention_4d_attn_mask_causal_bf16": ATTENTION_BF16,
    "test_attention_4d_attn_mask_causal_bf16_expanded": BF16_ULP,
    "test_attention_4d_causal_bf16": ATTENTION_BF16,
    "test_attention_4d_causal_bf16_expanded": BF16_ULP,
    "test_attention_4d_causal_fp16_expanded": FP16_ULP,
    "test_attention_4d_causal_padded_kv_bf16": ATTENTION_BF16,
    "test_attention_4d_causal_padded_kv_bf16_expanded": BF16_ULP,
    "test_attention_4d_fp16_expanded": FP16_ULP,
    "test_attention_4d_gqa_causal_nonpad_decode_fp16_expanded": FP16_ULP,
    "test_attention_4d_gqa_with_past_and_present_fp16_expanded": FP16_ULP,
    "test_attention_4d_padded_kv_bf16": ATTENTION_BF16,
    "test_attention_4d_padded_kv_bf16_expanded": BF16_ULP,
    "test_batchnorm_epsilon_training_mode": BN_TRAINING,
    "test_batchnorm_example_training_mode": BN_TRAINING,
    "test_causal_conv_with_state_silu_fp16_expanded": FP16_ULP,
    "test_equal_string": STRING,
    "test_equal_string_broadcast": STRING,
    "test_training_dropout": TRAINING,
    "test_training_dropout_default": TRAINING,
    "test_training_dropout_default_mask": TRAINING,
    "test_training_dropout_mask": TRAINING,
}
