/* Fused kernels for seq2seq, compiled on first use for the CPU they run on
 * (seq2seq/native/__init__.py; docs/performance.md#native-decoding-kernels).
 *
 * Why hand-written: some parts of a step are chains of memory-bound torch ops over large
 * blocks, which no library fuses on a CPU (torch.compile was measured slower,
 * docs/performance.md):
 *   - additive attention scores, (B, G, S, A) add + sigmoid + v-product, one pass here
 *     (and their gradients, for fp32 training);
 *   - decoding's vocabulary side: bf16 logits -> fp32 copy -> log-softmax -> top-k, three
 *     to five passes over (rows, V) in torch, one read of the logits here;
 *   - the fused loss's softmax part: loss and gradient of a chunk of logits, likewise.
 *
 * No headers and no libc at link time (built with -nostdlib): the few symbols used
 * (logf, memcpy/memset the compiler may emit) resolve against the Python process, so a
 * bare C compiler is all it needs. Everything is computed in fp32; bf16 inputs are
 * widened exactly. Inputs are contiguous, rows of a matrix back to back.
 */

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

float logf(float);

static inline float bf16_to_f32(u16 h) {
    u32 u = (u32)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* max of x (V,), 16 lanes at a time so that the compiler vectorizes it */
static float row_max(const float *x, i64 V) {
    float m16[16];
    for (int l = 0; l < 16; l++)
        m16[l] = -__builtin_inff();
    i64 full = V / 16 * 16;
    for (i64 i = 0; i < full; i += 16)
        for (int l = 0; l < 16; l++)
            m16[l] = x[i + l] > m16[l] ? x[i + l] : m16[l];
    float m = -__builtin_inff();
    for (int l = 0; l < 16; l++)
        m = m16[l] > m ? m16[l] : m;
    for (i64 i = full; i < V; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* Row r of a matrix with V columns as fp32: the row itself, or for bf16 (is_bf16) the
 * row widened into buf (V,). */
static const float *widen_row(const void *m, i64 r, i64 V, int is_bf16, float *buf) {
    if (!is_bf16)
        return (const float *)m + r * V;
    const u16 *h = (const u16 *)m + r * V;
    for (i64 i = 0; i < V; i++)
        buf[i] = bf16_to_f32(h[i]);
    return buf;
}

/* exp(x) for x <= 0 (the callers' range) down to ~-87: 2^n * p(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2] and p the degree-6 Taylor polynomial (relative error
 * ~2e-7). Plain arithmetic so that the compiler vectorizes the loops calling it; a call
 * to libm's expf would keep them scalar. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int e = ((int)n + 127) << 23;
    float s;
    __builtin_memcpy(&s, &e, 4);
    return p * s;
}

/* sigmoid(z) for any z through e = exp(-|z|) only, so fast_exp's range holds:
 * 1 / (1 + e) for z >= 0, e / (1 + e) below (no cancellation for large negative z). */
static inline float sigmoid(float z) {
    float e = fast_exp(z < 0.0f ? z : -z);
    float s = 1.0f / (1.0f + e);
    return z < 0.0f ? e * s : s;
}

/* One (sentence, source position): scores of its G queries against key k (A,). */
static void score_key(const float *q2, const float *k2, const float *v, float vsum, i64 G, i64 A,
                      i64 S, float *out) {
    for (i64 g = 0; g < G; g++) {
        const float *q = q2 + g * A;
        float acc = 0.0f;
        for (i64 a = 0; a < A; a++)
            acc += v[a] * sigmoid(q[a] + k2[a]);
        out[g * S] = 2.0f * acc - vsum;
    }
}

/* Additive attention scores through the sigmoid (seq2seq/model/attention.py,
 * AdditiveScorer): out[b, g, j] = 2 sum_a v[a] sigmoid(q2[b, g, a] + 2 keys[b, j, a]) - vsum.
 * q2 (B, G, A) is 2 W q; keys (B, S, A); v (A,) fp32; out (B, G, S) fp32.
 * bf16: q2 and keys are bf16 (is_bf16 = 1), else fp32. */
static void additive_scores_rows(const void *q2, const void *keys, const float *v, float vsum,
                                 i64 B, i64 G, i64 S, i64 A, int is_bf16, float *out) {
    float qf[G * A];
    float kf[A];
    for (i64 b = 0; b < B; b++) {
        const float *q = (const float *)q2 + b * G * A;
        if (is_bf16) {
            const u16 *qh = (const u16 *)q2 + b * G * A;
            for (i64 i = 0; i < G * A; i++)
                qf[i] = bf16_to_f32(qh[i]);
            q = qf;
        }
        for (i64 j = 0; j < S; j++) {
            i64 row = (b * S + j) * A;
            if (is_bf16) {
                const u16 *kh = (const u16 *)keys + row;
                for (i64 a = 0; a < A; a++)
                    kf[a] = 2.0f * bf16_to_f32(kh[a]);
            } else {
                const float *kr = (const float *)keys + row;
                for (i64 a = 0; a < A; a++)
                    kf[a] = 2.0f * kr[a];
            }
            score_key(q, kf, v, vsum, G, A, S, out + b * G * S + j);
        }
    }
}

/* The gradients of additive_scores (fp32 only; training): with z = q2 + 2 k and
 * s = sigmoid(z), d score / d q2 = 2 v s (1 - s), d score / d k = 4 v s (1 - s) and
 * d score / d v = 2 s - 1. Given grad (B, G, S): grad_q2 (B, G, A), grad_keys (B, S, A)
 * and grad_v (A,) are written (not added to); sigmoid is recomputed, nothing was saved. */
static void additive_scores_backward_rows(const float *q2, const float *keys, const float *v,
                                          const float *grad, i64 B, i64 G, i64 S, i64 A,
                                          float *grad_q2, float *grad_keys, float *grad_v,
                                          int add_keys) {
    float k2[A];
    for (i64 a = 0; a < A; a++)
        grad_v[a] = 0.0f;
    for (i64 i = 0; i < B * G * A; i++)
        grad_q2[i] = 0.0f;
    for (i64 b = 0; b < B; b++) {
        for (i64 j = 0; j < S; j++) {
            const float *kr = keys + (b * S + j) * A;
            float *gk = grad_keys + (b * S + j) * A;
            for (i64 a = 0; a < A; a++) {
                k2[a] = 2.0f * kr[a];
                if (!add_keys)
                    gk[a] = 0.0f;
            }
            for (i64 g = 0; g < G; g++) {
                float up = grad[(b * G + g) * S + j];
                if (up == 0.0f) /* a masked position: its weight, and gradient, is zero */
                    continue;
                const float *q = q2 + (b * G + g) * A;
                float *gq = grad_q2 + (b * G + g) * A;
                for (i64 a = 0; a < A; a++) {
                    float sg = sigmoid(q[a] + k2[a]);
                    float t = 2.0f * up * v[a] * sg * (1.0f - sg);
                    gq[a] += t;
                    gk[a] += 2.0f * t;
                    grad_v[a] += up * (2.0f * sg - 1.0f);
                }
            }
        }
    }
}

#define BLOCK 64 /* vocabulary entries per block: a block whose maximum cannot enter is skipped */

/* Keep x[i] in the descending top-k list (vals, idx) if it beats the last entry. */
static void scan(const float *x, i64 lo, i64 hi, i64 k, const i64 *skip, i64 n_skip, float *vals,
                 i64 *idx) {
    for (i64 i = lo; i < hi; i++) {
        float t = x[i];
        if (!(t > vals[k - 1]))
            continue;
        int skipped = 0;
        for (i64 s = 0; s < n_skip; s++)
            skipped |= i == skip[s];
        if (skipped)
            continue;
        i64 p = k - 1;
        while (p > 0 && vals[p - 1] < t) {
            vals[p] = vals[p - 1];
            idx[p] = idx[p - 1];
            p--;
        }
        vals[p] = t;
        idx[p] = i;
    }
}

/* One row x (V,) fp32 -> its k best log-softmax values (descending) and their indices. */
static void topk_row(const float *x, i64 V, i64 k, const i64 *skip, i64 n_skip, float *vals,
                     i64 *idx, float *block_max, char *seen) {
    i64 blocks = V / BLOCK;
    for (i64 bl = 0; bl < blocks; bl++) {
        block_max[bl] = row_max(x + bl * BLOCK, BLOCK);
        seen[bl] = 0;
    }
    float mx = -__builtin_inff();
    for (i64 bl = 0; bl < blocks; bl++)
        mx = block_max[bl] > mx ? block_max[bl] : mx;
    for (i64 i = blocks * BLOCK; i < V; i++)
        mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (i64 i = 0; i < V; i++)
        sum += fast_exp(x[i] - mx);
    float log_sum = logf(sum);
    for (i64 i = 0; i < k; i++) {
        vals[i] = -__builtin_inff();
        idx[i] = -1;
    }
    /* the k blocks with the largest maxima first; then only blocks that can still enter */
    for (i64 r = 0; r < k && r < blocks; r++) {
        i64 best = -1;
        for (i64 bl = 0; bl < blocks; bl++)
            if (!seen[bl] && (best < 0 || block_max[bl] > block_max[best]))
                best = bl;
        seen[best] = 1;
        scan(x, best * BLOCK, best * BLOCK + BLOCK, k, skip, n_skip, vals, idx);
    }
    for (i64 bl = 0; bl < blocks; bl++)
        if (!seen[bl] && block_max[bl] > vals[k - 1])
            scan(x, bl * BLOCK, bl * BLOCK + BLOCK, k, skip, n_skip, vals, idx);
    scan(x, blocks * BLOCK, V, k, skip, n_skip, vals, idx);
    for (i64 i = 0; i < k; i++) /* the order of torch's log_softmax: (x - max) - log(sum) */
        vals[i] = (vals[i] - mx) - log_sum;
}

/* logits (N, V), fp32 or bf16 (is_bf16) -> per row the k largest log-probabilities
 * vals (N, k) fp32, best first, and their indices idx (N, k); the n_skip token ids in
 * skip (PAD, BOS) count in the softmax but are never chosen. Needs k <= V - n_skip. */
static void vocab_topk_rows(const void *logits, i64 N, i64 V, i64 k, const i64 *skip,
                            i64 n_skip, int is_bf16, float *vals, i64 *idx) {
    float row[is_bf16 ? V : 1];
    float block_max[V / BLOCK + 1];
    char seen[V / BLOCK + 1];
    for (i64 r = 0; r < N; r++) {
        const float *x = widen_row(logits, r, V, is_bf16, row);
        topk_row(x, V, k, skip, n_skip, vals + r * k, idx + r * k, block_max, seen);
    }
}

static inline u16 f32_to_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
    u32 u;
    __builtin_memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

/* The fused loss's softmax part for rows of logits (N, V), fp32 or bf16 (in_bf16): per row
 * with lse = log sum exp z and label smoothing eps, loss_rows[r] = (1-eps)(lse - z_y) +
 * eps (lse - mean z) (torch's cross_entropy), and, unless grad is NULL, the gradient
 * softmax(z) - (1-eps) onehot(y) - eps/V written to grad (N, V) in fp32 or bf16
 * (grad_bf16) and added to grad_b (V,) unless that is NULL. One read of the logits,
 * one write of the gradient; work is a caller-provided (V,) fp32 buffer. grad may be the
 * logits themselves: a row is read in full before its gradient is written. */
static void cross_entropy_block(const void *logits, int in_bf16, i64 N, i64 V,
                                const i64 *target, float eps, float *loss_rows, void *grad,
                                int grad_bf16, float *grad_b, float *work) {
    for (i64 r = 0; r < N; r++) {
        const float *x = widen_row(logits, r, V, in_bf16, work);
        float mx = row_max(x, V), total = 0.0f;
        for (i64 i = 0; i < V; i++)
            total += x[i];
        i64 y = target[r];
        float z_y = x[y];
        float sum = 0.0f; /* work[i] = exp(x[i] - max), kept for the gradient */
        for (i64 i = 0; i < V; i++) {
            float e = fast_exp(x[i] - mx);
            work[i] = e;
            sum += e;
        }
        float lse = mx + logf(sum);
        loss_rows[r] = (1.0f - eps) * (lse - z_y) + eps * (lse - total / (float)V);
        if (!grad)
            continue;
        float inv = 1.0f / sum, floor_ = eps / (float)V;
        work[y] -= (1.0f - eps) * sum; /* the one-hot term, scaled back by inv below */
        if (grad_bf16) {
            u16 *gh = (u16 *)grad + r * V;
            for (i64 i = 0; i < V; i++)
                gh[i] = f32_to_bf16(work[i] * inv - floor_);
        } else {
            float *gf = (float *)grad + r * V;
            for (i64 i = 0; i < V; i++)
                gf[i] = work[i] * inv - floor_;
        }
        if (grad_b)
            for (i64 i = 0; i < V; i++)
                grad_b[i] += work[i] * inv - floor_;
    }
}

/* tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|), in fast_exp's range */
static inline float tanh_f(float x) {
    float a = x < 0.0f ? -x : x;
    float e = fast_exp(-2.0f * a);
    float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
}

/* A GRU's gates, as torch's GRU (seq2seq/model/loop_rnn.py, _GRUGates): from the
 * products gi = W_i x + b_i and gh = W_h h + b_h (rows, 3H), gate order r, z, n, and the
 * state h (rows, H): r = s(i_r + h_r), z = s(i_z + h_z), n = tanh(i_n + r h_n),
 * out = n + z (h - n) (rows, H). keep (rows, 3H) receives r, z, n for the backward. */
static void gru_gates_rows(const float *restrict gi, const float *restrict gh,
                           const float *restrict h, i64 rows, i64 H, float *restrict out,
                           float *restrict keep) {
    for (i64 b = 0; b < rows; b++) {
        const float *restrict x = gi + b * 3 * H, *restrict y = gh + b * 3 * H;
        const float *restrict hb = h + b * H;
        float *restrict o = out + b * H, *restrict k = keep + b * 3 * H;
#pragma GCC ivdep
        for (i64 j = 0; j < H; j++) {
            float r = sigmoid(x[j] + y[j]);
            float z = sigmoid(x[H + j] + y[H + j]);
            float n = tanh_f(x[2 * H + j] + r * y[2 * H + j]);
            o[j] = n + z * (hb[j] - n);
            k[j] = r;
            k[H + j] = z;
            k[2 * H + j] = n;
        }
    }
}

/* The gradients of gru_gates from grad (rows, H) of out: grad_gi, grad_gh (rows, 3H) and
 * grad_h (rows, H); keep is gru_gates' (r, z, n), gh and h its inputs. */
static void gru_gates_backward_rows(const float *restrict grad, const float *restrict keep,
                                    const float *restrict gh, const float *restrict h,
                                    i64 rows, i64 H, float *restrict grad_gi,
                                    float *restrict grad_gh, float *restrict grad_h) {
    for (i64 b = 0; b < rows; b++) {
        const float *restrict g = grad + b * H, *restrict k = keep + b * 3 * H;
        const float *restrict y = gh + b * 3 * H, *restrict hb = h + b * H;
        float *restrict di = grad_gi + b * 3 * H, *restrict dh = grad_gh + b * 3 * H;
        float *restrict dx = grad_h + b * H;
#pragma GCC ivdep
        for (i64 j = 0; j < H; j++) {
            float r = k[j], z = k[H + j], n = k[2 * H + j];
            float d_n = g[j] * (1.0f - z) * (1.0f - n * n);
            float d_z = g[j] * (hb[j] - n) * z * (1.0f - z);
            float d_r = d_n * y[2 * H + j] * r * (1.0f - r);
            di[j] = d_r;
            di[H + j] = d_z;
            di[2 * H + j] = d_n;
            dh[j] = d_r;
            dh[H + j] = d_z;
            dh[2 * H + j] = d_n * r;
            dx[j] = g[j] * z;
        }
    }
}

/* Blocks of rows over torch's threads.
 *
 * A kernel's rows are independent (a sentence's scores, a logit row's softmax), so the
 * exported entry points below split them into `blocks` contiguous blocks, one per thread
 * of the OpenMP team torch itself runs its ops on: GOMP_parallel, resolved at load time
 * against the libgomp that torch has already loaded (seq2seq/native/__init__.py imports
 * torch first; declared weak so a process without it still loads these kernels, and then
 * runs the blocks one after another). Python's threads would need the GIL to start each
 * block, and a pool of their own competes with torch's spinning threads for the cores.
 * Sums over rows (the gradient of v, of the bias) are formed per block; the caller adds
 * them, so results do not depend on scheduling. */
extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags)
    __attribute__((weak));
extern int omp_get_thread_num(void) __attribute__((weak));
extern int omp_get_num_threads(void) __attribute__((weak));

typedef void (*block_fn)(const void *args, i64 lo, i64 hi, int block);
struct team {
    block_fn fn;
    const void *args;
    i64 rows;
    int blocks;
};

static void team_member(void *data) {
    const struct team *t = data;
    /* a team smaller than asked for (OMP_THREAD_LIMIT) still runs every block */
    for (int b = omp_get_thread_num(); b < t->blocks; b += omp_get_num_threads())
        t->fn(t->args, t->rows * b / t->blocks, t->rows * (b + 1) / t->blocks, b);
}

static void run_blocks(block_fn fn, const void *args, i64 rows, int blocks) {
    blocks = blocks < 1 ? 1 : blocks;
    if (blocks > 1 && GOMP_parallel && omp_get_thread_num && omp_get_num_threads) {
        struct team t = {fn, args, rows, blocks};
        GOMP_parallel(team_member, &t, (unsigned)blocks, 0);
        return;
    }
    for (int b = 0; b < blocks; b++)
        fn(args, rows * b / blocks, rows * (b + 1) / blocks, b);
}

struct scores_args {
    const char *q2, *keys;
    const float *v;
    float vsum;
    i64 G, S, A, size;
    int is_bf16;
    float *out;
};

static void scores_block(const void *p, i64 lo, i64 hi, int b) {
    const struct scores_args *a = p;
    (void)b;
    additive_scores_rows(a->q2 + lo * a->G * a->A * a->size, a->keys + lo * a->S * a->A * a->size,
                         a->v, a->vsum, hi - lo, a->G, a->S, a->A, a->is_bf16,
                         a->out + lo * a->G * a->S);
}

/* additive_scores_rows (above), its B rows in `blocks` blocks. */
void additive_scores(const void *q2, const void *keys, const float *v, float vsum, i64 B, i64 G,
                     i64 S, i64 A, int is_bf16, float *out, int blocks) {
    struct scores_args a = {q2, keys, v, vsum, G, S, A, is_bf16 ? 2 : 4, is_bf16, out};
    run_blocks(scores_block, &a, B, blocks);
}

struct scores_grad_args {
    const float *q2, *keys, *v, *grad;
    i64 G, S, A;
    float *grad_q2, *grad_keys, *grad_v;
    int add_keys;
};

static void scores_grad_block(const void *p, i64 lo, i64 hi, int b) {
    const struct scores_grad_args *a = p;
    additive_scores_backward_rows(a->q2 + lo * a->G * a->A, a->keys + lo * a->S * a->A, a->v,
                                  a->grad + lo * a->G * a->S, hi - lo, a->G, a->S, a->A,
                                  a->grad_q2 + lo * a->G * a->A, a->grad_keys + lo * a->S * a->A,
                                  a->grad_v + b * a->A, a->add_keys);
}

/* The gradients of additive_scores, as additive_scores_backward_rows, with rows in
 * `blocks` blocks; grad_v is (blocks, A), block b's sum in row b. */
void additive_scores_backward(const float *q2, const float *keys, const float *v,
                              const float *grad, i64 B, i64 G, i64 S, i64 A, float *grad_q2,
                              float *grad_keys, float *grad_v, int add_keys, int blocks) {
    struct scores_grad_args a = {q2, keys, v, grad, G, S, A, grad_q2, grad_keys, grad_v,
                                 add_keys};
    run_blocks(scores_grad_block, &a, B, blocks);
}

struct loss_args {
    const char *logits;
    int in_bf16;
    i64 V;
    const i64 *target;
    float eps;
    float *loss_rows;
    char *grad;
    int grad_bf16;
    float *grad_b, *work;
};

static void loss_block(const void *p, i64 lo, i64 hi, int b) {
    const struct loss_args *a = p;
    i64 in_size = a->in_bf16 ? 2 : 4, grad_size = a->grad_bf16 ? 2 : 4;
    cross_entropy_block(a->logits + lo * a->V * in_size, a->in_bf16, hi - lo, a->V,
                        a->target + lo, a->eps, a->loss_rows + lo,
                        a->grad ? a->grad + lo * a->V * grad_size : 0, a->grad_bf16,
                        a->grad_b ? a->grad_b + b * a->V : 0, a->work + b * a->V);
}

/* The fused loss's softmax part, as cross_entropy_block, with rows in `blocks` blocks;
 * grad_b (blocks, V): block b adds its rows' gradient sums into row b; work (blocks, V). */
void cross_entropy_rows(const void *logits, int in_bf16, i64 N, i64 V, const i64 *target,
                        float eps, float *loss_rows, void *grad, int grad_bf16, float *grad_b,
                        float *work, int blocks) {
    struct loss_args a = {logits, in_bf16, V, target, eps, loss_rows, grad, grad_bf16, grad_b,
                          work};
    run_blocks(loss_block, &a, N, blocks);
}

struct topk_args {
    const char *logits;
    i64 V, k;
    const i64 *skip;
    i64 n_skip;
    int is_bf16;
    float *vals;
    i64 *idx;
};

static void topk_block(const void *p, i64 lo, i64 hi, int b) {
    const struct topk_args *a = p;
    (void)b;
    vocab_topk_rows(a->logits + lo * a->V * (a->is_bf16 ? 2 : 4), hi - lo, a->V, a->k, a->skip,
                    a->n_skip, a->is_bf16, a->vals + lo * a->k, a->idx + lo * a->k);
}

/* vocab_topk_rows (above), its N rows in `blocks` blocks. */
void vocab_topk(const void *logits, i64 N, i64 V, i64 k, const i64 *skip, i64 n_skip,
                int is_bf16, float *vals, i64 *idx, int blocks) {
    struct topk_args a = {logits, V, k, skip, n_skip, is_bf16, vals, idx};
    run_blocks(topk_block, &a, N, blocks);
}

struct gates_args {
    const float *gi, *gh, *h;
    i64 H;
    float *out, *keep;
};

static void gates_block(const void *p, i64 lo, i64 hi, int b) {
    const struct gates_args *a = p;
    (void)b;
    gru_gates_rows(a->gi + lo * 3 * a->H, a->gh + lo * 3 * a->H, a->h + lo * a->H, hi - lo,
                   a->H, a->out + lo * a->H, a->keep + lo * 3 * a->H);
}

/* gru_gates_rows (above), its rows in `blocks` blocks. */
void gru_gates(const float *gi, const float *gh, const float *h, i64 rows, i64 H, float *out,
               float *keep, int blocks) {
    struct gates_args a = {gi, gh, h, H, out, keep};
    run_blocks(gates_block, &a, rows, blocks);
}

struct gates_grad_args {
    const float *grad, *keep, *gh, *h;
    i64 H;
    float *grad_gi, *grad_gh, *grad_h;
};

static void gates_grad_block(const void *p, i64 lo, i64 hi, int b) {
    const struct gates_grad_args *a = p;
    i64 H = a->H;
    (void)b;
    gru_gates_backward_rows(a->grad + lo * H, a->keep + lo * 3 * H, a->gh + lo * 3 * H,
                            a->h + lo * H, hi - lo, H, a->grad_gi + lo * 3 * H,
                            a->grad_gh + lo * 3 * H, a->grad_h + lo * H);
}

/* gru_gates_backward_rows (above), its rows in `blocks` blocks. */
void gru_gates_backward(const float *grad, const float *keep, const float *gh, const float *h,
                        i64 rows, i64 H, float *grad_gi, float *grad_gh, float *grad_h,
                        int blocks) {
    struct gates_grad_args a = {grad, keep, gh, h, H, grad_gi, grad_gh, grad_h};
    run_blocks(gates_grad_block, &a, rows, blocks);
}
