/* tests/op_cases.h: one small model per op (forward and backward), shared
 * by the finite-difference gradient check (test_gradcheck.c), the NVRTC
 * compile test and the GPU-versus-CPU op test. */
#ifndef DUET_OP_CASES_H
#define DUET_OP_CASES_H

typedef struct Case {
  const char *name;
  const char *src;
  int classes; /* i32 inputs are filled with values in [0, classes) */
} Case;

#define HEAD "model t\n"
static const Case cases[] = {
    {"matmul", HEAD "param a: [3,4]\nparam b: [4,5]\ninput r: f32[3,5]\nloss = mean((a @ b) * r)\n", 0},
    {"matmul_input", HEAD "input x: f32[3,4]\nparam w: [4,2]\ninput r: f32[3,2]\nloss = mean((x @ w) * r)\n", 0},
    {"add_broadcast",
     HEAD "param a: [3,4]\nparam b: [4]\nparam c: [3,1]\ninput r: f32[3,4]\nloss = mean((a + b + c) * r)\n", 0},
    {"sub_broadcast", HEAD "param a: [3,4]\nparam b: [4]\ninput r: f32[3,4]\nloss = mean((a - b) * r + (b - a) * r * r)\n", 0},
    {"mul_broadcast", HEAD "param a: [3,4]\nparam b: [1,4]\ninput r: f32[3,4]\nloss = mean(a * b * r)\n", 0},
    {"div_broadcast", HEAD "param a: [3,4]\nparam b: [3,1]\ninput r: f32[3,4]\nloss = mean((a / b) * r)\n", 0},
    {"neg_const", HEAD "param a: [2,3]\ninput r: f32[2,3]\nloss = mean((-a * 2 + 3 - a / 4) * r)\n", 0},
    {"relu", HEAD "param a: [4,5]\ninput r: f32[4,5]\nloss = mean(relu(a) * r)\n", 0},
    {"mean", HEAD "param a: [7]\nloss = mean(a * a)\n", 0},
    {"reuse", HEAD "param a: [3,3]\ninput r: f32[3,3]\nloss = mean((a * a + a @ a + a) * r)\n", 0},
    {"cross_entropy", HEAD "param z: [4,5]\ninput y: i32[4]\nloss = cross_entropy(z, y)\n", 5},
    {"gelu", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean(gelu(a * 3) * r)\n", 0},
    {"embedding", HEAD "param e: [7,3]\ninput i: i32[2,4]\ninput r: f32[2,4,3]\nloss = mean(embedding(e, i) * r)\n", 7},
    {"layernorm", HEAD "param x: [3,6]\nparam w: [6]\nparam b: [6]\ninput r: f32[3,6]\n"
                  "loss = mean(layernorm(x, w, b) * r)\n", 0},
    {"attention_causal", HEAD "param q: [2,5,4]\nparam k: [2,5,4]\nparam v: [2,5,4]\ninput r: f32[2,5,4]\n"
                         "loss = mean(attention(q, k, v, heads = 2, causal = true) * r)\n", 0},
    {"attention_full", HEAD "param q: [1,3,6]\nparam k: [1,3,6]\nparam v: [1,3,6]\ninput r: f32[1,3,6]\n"
                       "loss = mean(attention(q * 2, k, v, heads = 3) * r)\n", 0},
    {"matmul_rank3_tied", HEAD "param x: [2,3,4]\nparam w: [5,4]\ninput y: i32[2,3]\n"
                          "loss = cross_entropy(x @ transpose(w), y)\n", 5},
    {"transpose", HEAD "param a: [3,4]\ninput r: f32[4,3]\nloss = mean(transpose(a) * r)\n", 0},
    {"dropout", HEAD "param a: [4,6]\ninput r: f32[4,6]\nloss = mean(dropout(a * a, p = 0.3) * r + dropout(a, 0.5))\n", 0},
    {"dropout_broadcast", HEAD "param a: [4,6]\nparam c: [6]\ninput r: f32[4,6]\nloss = mean(dropout(a + c, 0.4) * r)\n", 0},
    {"conv2d", HEAD "param x: [2,3,5,5]\nparam w: [4,3,3,3]\nparam b: [4]\ninput r: f32[2,4,3,3]\n"
               "loss = mean(conv2d(x, w, b, stride = 2, padding = 1, dilation = 1) * r)\n", 0},
    {"conv2d_dilated_groups", HEAD "param x: [1,4,6,6]\nparam w: [6,2,2,2]\ninput r: f32[1,6,4,4]\n"
                              "loss = mean(conv2d(x, w, dilation = 2, groups = 2) * r)\n", 0},
    {"max_pool2d", HEAD "param x: [2,2,5,5]\ninput r: f32[2,2,3,3]\nloss = mean(max_pool2d(x, 3, stride = 2, padding = 1) * r)\n", 0},
    {"avg_pool2d", HEAD "param x: [1,2,4,6]\ninput r: f32[1,2,2,3]\nloss = mean(avg_pool2d(x, 2) * r)\n", 0},
    {"reshape_permute", HEAD "param x: [2,3,4]\ninput r: f32[4,2,3]\n"
                        "loss = mean(permute(reshape(x, 3, -1, 2), 1, 0, 2) * reshape(r, 4, 3, 2) + reshape(flatten(transpose(x, 0, 2)), 4, 3, 2) * 0.5)\n", 0},
    {"concat", HEAD "param a: [2,3]\nparam b: [2,5]\ninput r: f32[2,8]\nloss = mean(concat(a, b * b, axis = 1) * r)\n", 0},
    {"axis_reductions", HEAD "param x: [3,4,5]\ninput r: f32[3,5]\ninput u: f32[4,5]\n"
                        "loss = mean(sum(x, axis = 1) * r) + mean(max(x, axis = 0) * u) + mean(mean(x, -1)) + sum(x) * 0.01\n", 0},
    {"split_tuple_repeat", HEAD "param t: [2,6]\ninput r: f32[2,2]\n"
                           "block pair(x) {\n  a, b = split(x, 2)\n  return a * b, a + b\n}\n"
                           "block sq(x) {\n  param w: [2, 2] = normal(0.5)\n  return x @ w\n}\n"
                           "p, q, s = split(t, 3, axis = 1)\nm, n = pair(concat(p, q, axis = 1))\n"
                           "loss = mean(repeat(3, sq, m * n + s) * r)\n", 0},
    /* issue 19: the elementwise ops, softmax, rmsnorm, mse_loss, rope and
     * grouped-query attention (kv_heads < heads) */
    {"exp_log", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean((exp(a) + log(a * a + 0.5) * 2) * r)\n", 0},
    {"tanh", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean(tanh(a * 2) * r)\n", 0},
    {"sigmoid", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean(sigmoid(a * 3) * r)\n", 0},
    {"silu", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean(silu(a * 3) * r)\n", 0},
    {"softmax", HEAD "param a: [3,5]\ninput r: f32[3,5]\nloss = mean(softmax(a * 2) * r)\n", 0},
    {"softmax_axis", HEAD "param a: [2,4,3]\ninput r: f32[2,4,3]\nloss = mean(softmax(a * 2, axis = 1) * r) + "
                     "mean(softmax(a, 0) * r)\n", 0},
    {"rmsnorm", HEAD "param x: [3,6]\nparam w: [6]\ninput r: f32[3,6]\nloss = mean(rmsnorm(x, w, eps = 0.01) * r)\n", 0},
    {"mse_loss", HEAD "param a: [3,4]\nparam b: [4,2]\nparam c: [3,2]\ninput y: f32[3,2]\n"
                 "loss = mse_loss(a @ b, y) + mse_loss(c, a @ b) * 0.5\n", 0},
    {"rope", HEAD "param q: [2,5,8]\ninput r: f32[2,5,8]\n"
             "loss = mean(rope(q, heads = 2) * r) + mean(rope(q * q, 1, base = 100) * r)\n", 0},
    {"attention_gqa", HEAD "param q: [2,5,8]\nparam k: [2,5,4]\nparam v: [2,5,4]\ninput r: f32[2,5,8]\n"
                      "loss = mean(attention(q, k, v, heads = 4, kv_heads = 2, causal = true) * r)\n", 0},
    {"attention_mqa", HEAD "param q: [1,4,6]\nparam k: [1,4,2]\nparam v: [1,4,2]\ninput r: f32[1,4,6]\n"
                      "loss = mean(attention(q * 2, k, v, heads = 3, kv_heads = 1) * r)\n", 0},
    {"mlp", HEAD "input x: f32[6,4]\ninput y: i32[6]\n"
                 "block linear(h, out) {\n  param w: [dim(h, -1), out] = xavier_uniform\n"
                 "  param b: [out] = normal(0.1)\n  return h @ w + b\n}\n"
                 "loss = cross_entropy(linear(relu(linear(x, 5)), 3), y)\n", 3},
    /* gradient clipping (a limit far below the norm: every step clips):
     * the sum-of-squares and scale kernels */
    {"clip_grad_norm", HEAD "param a: [6,7]\nparam b: [7]\ninput r: f32[6,7]\nloss = mean((a * a + b) * r)\n"
                       "train {\n  clip_grad_norm = 0.0001\n}\n", 0},
};

#define N_OP_CASES ((int)(sizeof cases / sizeof *cases))

/* Larger shapes for the GPU: multi-block reductions, grid-stride loops,
 * attention over 200 positions (not finite-differenced: too many
 * elements). */
static const Case big_cases[] = {
    {"big_cross_entropy", "model t\nparam z: [300,1000]\ninput y: i32[300]\nloss = cross_entropy(z * 3, y)\n", 1000},
    {"big_layernorm", "model t\nparam x: [64,1000]\nparam w: [1000]\nparam b: [1000]\ninput r: f32[64,1000]\n"
                      "loss = mean(layernorm(x * 2, w, b) * r)\n", 0},
    {"big_attention", "model t\nparam q: [2,200,64]\nparam k: [2,200,64]\nparam v: [2,200,64]\ninput r: f32[2,200,64]\n"
                      "loss = mean(attention(q, k, v, heads = 4, causal = true) * r)\n", 0},
    {"big_attention_full", "model t\nparam q: [1,70,96]\nparam k: [1,70,96]\nparam v: [1,70,96]\ninput r: f32[1,70,96]\n"
                           "loss = mean(attention(q, k, v, heads = 3) * r)\n", 0},
    {"big_reductions", "model t\nparam x: [37,513,9]\ninput r: f32[37,9]\ninput u: f32[513,9]\n"
                       "loss = mean(sum(x, axis = 1) * r) + mean(max(x, axis = 0) * u) + sum(x) * 0.001\n", 0},
    {"big_transpose", "model t\nparam a: [100,70]\ninput r: f32[70,100]\nloss = mean(transpose(a) * r)\n", 0},
    /* 300 columns: the CUDA backward splits the 1000 rows into 218 chunks
     * of 5, the last partly and 18 entirely past the table */
    {"big_embedding", "model t\nparam e: [1000,300]\ninput i: i32[2,300]\ninput r: f32[2,300,300]\n"
                      "loss = mean(embedding(e, i) * r)\n", 1000},
    {"big_pool", "model t\nparam x: [4,8,20,20]\ninput r: f32[4,8,10,10]\ninput u: f32[4,8,7,7]\n"
                 "loss = mean(avg_pool2d(x, 2) * r) + mean(max_pool2d(x, 3, stride = 3, padding = 1) * u)\n", 0},
    {"big_conv", "model t\nparam x: [4,3,16,16]\nparam w: [8,3,3,3]\nparam b: [8]\ninput r: f32[4,8,16,16]\n"
                 "loss = mean(relu(conv2d(x, w, b, padding = 1)) * r)\n", 0},
    {"big_gelu_dropout", "model t\nparam a: [300,700]\ninput r: f32[300,700]\n"
                         "loss = mean(dropout(gelu(a), p = 0.2) * r)\n", 0},
    /* issue 19: rows of 1000 (a block per row, 256 threads) and a middle
     * axis (a thread per column); a sum of squares over 128 blocks; rows
     * of 1000 normalised; rotary pairs over a grid-stride loop; 8 query
     * heads over 2 key/value heads across 200 positions */
    {"big_softmax", "model t\nparam a: [300,1000]\nparam b: [4,100,70]\ninput r: f32[300,1000]\ninput u: f32[4,100,70]\n"
                    "loss = mean(softmax(a * 3) * r) + mean(softmax(b * 3, axis = 1) * u)\n", 0},
    {"big_mse", "model t\nparam a: [300,700]\ninput y: f32[300,700]\nloss = mse_loss(silu(a), y)\n", 0},
    {"big_rmsnorm", "model t\nparam x: [64,1000]\nparam w: [1000]\ninput r: f32[64,1000]\n"
                    "loss = mean(rmsnorm(x * 2, w) * r)\n", 0},
    {"big_rope", "model t\nparam q: [4,300,128]\ninput r: f32[4,300,128]\nloss = mean(rope(q, heads = 2) * r)\n", 0},
    {"big_attention_gqa", "model t\nparam q: [2,200,64]\nparam k: [2,200,16]\nparam v: [2,200,16]\ninput r: f32[2,200,64]\n"
                          "loss = mean(attention(q, k, v, heads = 8, kv_heads = 2, causal = true) * r)\n", 0},
    /* gradient clipping: sums of squares over 3 chunks (C) and 9 blocks (CUDA) */
    {"big_clip_grad_norm", "model t\nparam a: [150,220]\nparam b: [220]\ninput r: f32[150,220]\n"
                           "loss = mean((a * a + b) * r)\ntrain {\n  clip_grad_norm = 0.0001\n}\n", 0},
};
#define N_BIG_CASES ((int)(sizeof big_cases / sizeof *big_cases))

#endif
