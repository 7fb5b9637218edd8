// Paged attention over the KV pool on a CUDA device, compiled at run time
// with NVRTC (no headers: halves are widened with bit operations and PTX).
//
// One warp per (query token, query head); loops over a lane's dimensions
// are unrolled to the most a lane holds, so q and the sums stay in registers. The warp's lanes split the head
// dimension; keys are visited in order through the sequence's block table,
// each score reduced across the warp, with an online softmax, so nothing is
// gathered and nothing the size of the context is written.
//
// q:      [tokens, heads, head_dim] f32
// k, v:   [slots, kv_heads * head_dim] in KV (f32, f16 or bf16)
// out:    [tokens, heads * head_dim] f32
// tables: every sequence's block table, concatenated
// table_of[t]: where token t's sequence's table starts in `tables`
// pos_of[t]:   token t's position; it attends to positions 0..=pos_of[t],
//              or to its window: pos_of[t] - window + 1 ..= pos_of[t]
// softcap: scores become softcap * tanh(score / softcap) (0: none)
// window: a sliding window (0: none); table entries before the window's
//         first block are never read (a windowed group may release them)
// chunk: chunked attention (0: none): position p sees only its own chunk,
//        p - p % chunk ..= p

#define MAX_DIMS_PER_LANE 8  // head_dim <= 256

__device__ __forceinline__ float widen_f32(float x) { return x; }

__device__ __forceinline__ float widen_bf16(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

__device__ __forceinline__ float widen_f16(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

#define PAGED_ATTENTION(NAME, T, WIDEN)                                          \
extern "C" __global__ void NAME(                                                 \
    const float* __restrict__ q, const T* __restrict__ k,                        \
    const T* __restrict__ v, float* __restrict__ out,                            \
    const unsigned int* __restrict__ tables,                                     \
    const unsigned int* __restrict__ table_of,                                   \
    const unsigned int* __restrict__ pos_of, int tokens, int heads,              \
    int kv_heads, int head_dim, int block_size, float scale, float softcap,       \
    int window, int chunk) {                                                     \
    const int lane = threadIdx.x & 31;                                           \
    const long long pair = (long long)blockIdx.x * (blockDim.x >> 5)             \
                           + (threadIdx.x >> 5);                                 \
    if (pair >= (long long)tokens * heads) return;                               \
    const int t = (int)(pair / heads), h = (int)(pair % heads);                  \
    const int kvh = h / (heads / kv_heads);                                      \
    const int per_lane = (head_dim + 31) >> 5;                                   \
    const float* qt = q + ((long long)t * heads + h) * head_dim;                 \
    float qr[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];                         \
    _Pragma("unroll")                                                            \
    for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {                                \
        const int d = lane + 32 * i;                                             \
        qr[i] = (i < per_lane && d < head_dim) ? qt[d] * scale : 0.0f;           \
        acc[i] = 0.0f;                                                           \
    }                                                                            \
    const unsigned int* table = tables + table_of[t];                            \
    const long long row = (long long)kv_heads * head_dim;                        \
    const int last = (int)pos_of[t];                                             \
    const int first_w = (window > 0 && last + 1 > window) ? last + 1 - window : 0;\
    const int first_c = chunk > 0 ? last - last % chunk : 0;                     \
    const int first = first_w > first_c ? first_w : first_c;                     \
    float m = __int_as_float(0xff800000), l = 0.0f;                              \
    for (int j = first; j <= last; ++j) {                                        \
        const long long slot =                                                   \
            (long long)table[j / block_size] * block_size + j % block_size;      \
        const T* kj = k + slot * row + (long long)kvh * head_dim;                \
        const T* vj = v + slot * row + (long long)kvh * head_dim;                \
        float s = 0.0f;                                                          \
        _Pragma("unroll")                                                        \
        for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {                            \
            const int d = lane + 32 * i;                                         \
            if (i < per_lane && d < head_dim) s += qr[i] * WIDEN(kj[d]);         \
        }                                                                        \
        s = warp_sum(s);                                                         \
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);                    \
        const float m_new = fmaxf(m, s);                                         \
        const float correction = __expf(m - m_new);                              \
        const float p = __expf(s - m_new);                                       \
        l = l * correction + p;                                                  \
        _Pragma("unroll")                                                        \
        for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {                            \
            const int d = lane + 32 * i;                                         \
            const float vd = (i < per_lane && d < head_dim) ? WIDEN(vj[d]) : 0.0f; \
            acc[i] = acc[i] * correction + p * vd;                               \
        }                                                                        \
        m = m_new;                                                               \
    }                                                                            \
    float* ot = out + ((long long)t * heads + h) * head_dim;                     \
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;                                \
    _Pragma("unroll")                                                            \
    for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {                                \
        const int d = lane + 32 * i;                                             \
        if (i < per_lane && d < head_dim) ot[d] = acc[i] * inv;                  \
    }                                                                            \
}

PAGED_ATTENTION(ferrox_paged_attention_f32, float, widen_f32)
PAGED_ATTENTION(ferrox_paged_attention_f16, unsigned short, widen_f16)
PAGED_ATTENTION(ferrox_paged_attention_bf16, unsigned short, widen_bf16)
