// Sparse row updates of an embedding table `rows` ([num_rows x dim]) from a
// list of (row, gradient) entries with duplicate rows, as the CPU owner does:
// the gradients of one row are summed in entry order (the first copied, the
// others added), the sum is scaled by `scale` (the averaging), and the row is
// updated once with
//   kind 0, SGD:               w -= lr * g
//   kind 1, row-wise Adagrad:  a += (sum_c g_c^2) / dim  (summed c = 0..dim-1);
//                              w -= (lr / (sqrt(a) + eps)) * g
// (`apply_row` in operators/src/optim.rs). `state` holds one accumulator per row.
//
// The entries arrive sorted by row (sorted_rows, stable: equal rows in entry
// order) with their original positions (sorted_pos). One warp per 32 sorted
// positions; the lane at the first entry of a row finds where the row's run
// ends (galloping, then a binary search) and
//   * a run of at most SHORT_RUN entries is updated by that lane alone, column
//     by column (row-wise Adagrad sums the run again after the accumulator
//     update, getting the same sums, rather than keeping dim values a thread);
//   * a longer run is updated by the whole warp, one after the other: each
//     lane sums its columns over the run in entry order into shared memory
//     (dim floats per warp; the host sizes it as blockDim / 32 * dim floats),
//     lane 0 adds the squares in column order.
// Either way every sum is taken in the same order with the same operations, so
// the table does not depend on which way a row went, nor on the run.
//
// A hot row (a run of at least split_min entries) is not summed by one warp
// alone: `chunk_partial_sums` first sums every chunk of `chunk` sorted positions
// (chunk k: positions [k chunk, (k + 1) chunk)) that lies inside one row's run,
// one warp per chunk, in entry order. The warp of the run then adds, from 0, its
// entries before the first whole chunk, the whole chunks' sums in chunk order,
// and its entries after the last one. That order is fixed by the sorted
// positions alone, so every run of a step gives the same table, but it is not
// the CPU's order (the sums agree to rounding). split_min >= 2 chunk, so such a
// run always holds a whole chunk; split_min = UINT_MAX sums every run in entry
// order.

#define SHORT_RUN 8

// The first sorted position after i whose row differs from keys[i] (n if none).
__device__ __forceinline__ unsigned int run_end(const unsigned int* keys, unsigned int n, unsigned int i) {
    const unsigned int u = keys[i];
    // Every position below lo (from i on) holds u; keys[hi] differs, or hi == n.
    unsigned int lo = i + 1, hi = n;
    for (unsigned long long step = 1;; step <<= 1) {
        const unsigned long long p = (unsigned long long)i + step;
        if (p >= n) break;
        if (keys[p] != u) {
            hi = (unsigned int)p;
            break;
        }
        lo = (unsigned int)p + 1;
    }
    while (lo < hi) {
        const unsigned int mid = lo + (hi - lo) / 2;
        if (keys[mid] == u) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// The scaled gradient of column c of the row whose entries are sorted positions [i, end).
__device__ __forceinline__ float run_grad(const unsigned int* sorted_pos, const float* grads, unsigned int dim,
                                          unsigned int i, unsigned int end, unsigned int c, float scale) {
    float acc = grads[(unsigned long long)sorted_pos[i] * dim + c];
    for (unsigned int j = i + 1; j < end; ++j) {
        acc += grads[(unsigned long long)sorted_pos[j] * dim + c];
    }
    return acc * scale;
}

// The scaled gradient of column c of a hot row's run [i, end) from the whole chunks' sums.
__device__ __forceinline__ float split_run_grad(const unsigned int* sorted_pos, const float* grads,
                                                const float* partial, unsigned int dim, unsigned int chunk,
                                                unsigned int i, unsigned int end, unsigned int c, float scale) {
    const unsigned int a = (i + chunk - 1) / chunk, b = end / chunk;  // whole chunks [a, b)
    float acc = 0.0f;
    for (unsigned int j = i; j < a * chunk; ++j) acc += grads[(unsigned long long)sorted_pos[j] * dim + c];
    for (unsigned int k = a; k < b; ++k) acc += partial[(unsigned long long)k * dim + c];
    for (unsigned int j = b * chunk; j < end; ++j) acc += grads[(unsigned long long)sorted_pos[j] * dim + c];
    return acc * scale;
}

// One warp per chunk of `chunk` sorted positions (the whole ones, n / chunk of them): a
// chunk inside one row's run gets its gradients' sum per column, in entry order.
extern "C" __global__ void chunk_partial_sums(const unsigned int* sorted_rows, const unsigned int* sorted_pos,
                                             unsigned int num_entries, const float* grads, unsigned int dim,
                                             unsigned int chunk, float* partial) {
    const unsigned long long k = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31;
    if (k >= num_entries / chunk) return;
    const unsigned long long first = k * chunk, last = first + chunk - 1;
    // Sorted, so a chunk whose ends hold one row holds only that row.
    if (sorted_rows[first] != sorted_rows[last]) return;
    for (unsigned int c = lane; c < dim; c += 32) {
        float acc = grads[(unsigned long long)sorted_pos[first] * dim + c];
        for (unsigned long long j = first + 1; j <= last; ++j) acc += grads[(unsigned long long)sorted_pos[j] * dim + c];
        partial[k * dim + c] = acc;
    }
}

// One thread updates row u from its entries [i, end).
__device__ void update_alone(const unsigned int* sorted_pos, const float* grads, unsigned int dim, float scale,
                             int kind, float lr, float eps, unsigned int i, unsigned int end, float* w,
                             float* acc_state) {
    if (kind == 0) {
        for (unsigned int c = 0; c < dim; ++c) w[c] -= lr * run_grad(sorted_pos, grads, dim, i, end, c, scale);
        return;
    }
    float sq = 0.0f;
    for (unsigned int c = 0; c < dim; ++c) {
        const float g = run_grad(sorted_pos, grads, dim, i, end, c, scale);
        sq += g * g;
    }
    const float a = *acc_state + sq / (float)dim;
    *acc_state = a;
    const float step = lr / (sqrtf(a) + eps);
    for (unsigned int c = 0; c < dim; ++c) w[c] -= step * run_grad(sorted_pos, grads, dim, i, end, c, scale);
}

// The whole warp updates row u from its entries [i, end); g: dim floats of shared memory.
// A run of at least split_min entries is summed from the chunks' sums (`partial`).
__device__ void update_by_warp(const unsigned int* sorted_pos, const float* grads, const float* partial,
                               unsigned int dim, unsigned int chunk, unsigned int split_min, float scale, int kind,
                               float lr, float eps, unsigned int i, unsigned int end, float* w, float* acc_state,
                               float* g, unsigned int lane) {
    const bool split = end - i >= split_min;
    for (unsigned int c = lane; c < dim; c += 32) {
        g[c] = split ? split_run_grad(sorted_pos, grads, partial, dim, chunk, i, end, c, scale)
                     : run_grad(sorted_pos, grads, dim, i, end, c, scale);
    }
    __syncwarp();
    float step = lr;
    if (kind != 0) {
        if (lane == 0) {
            float sq = 0.0f;
            for (unsigned int c = 0; c < dim; ++c) sq += g[c] * g[c];
            const float a = *acc_state + sq / (float)dim;
            *acc_state = a;
            step = lr / (sqrtf(a) + eps);
        }
        step = __shfl_sync(0xffffffffu, step, 0);
    }
    for (unsigned int c = lane; c < dim; c += 32) w[c] -= step * g[c];
    __syncwarp();
}

// Nothing is updated while skip[0] is not zero (the step's loss was not finite).
// The learning rate is read from `hyper[0]` (written by `write_scalars` before
// the update is queued, so a captured CUDA graph replays with each step's rate).
extern "C" __global__ void sparse_update_rows(const unsigned int* skip, const float* hyper,
                                              const unsigned int* sorted_rows, const unsigned int* sorted_pos,
                                              unsigned int num_entries, const float* grads, const float* partial,
                                              unsigned int dim, unsigned int chunk, unsigned int split_min,
                                              float scale, int kind, float eps, unsigned int num_rows, float* rows,
                                              float* state) {
    extern __shared__ float sums[];
    if (skip[0] != 0u) return;
    const float lr = hyper[0];
    const unsigned int lane = threadIdx.x & 31;
    float* g = sums + (unsigned long long)(threadIdx.x >> 5) * dim;
    // The warp's first sorted position (the same in every lane, so whole warps leave).
    const unsigned long long first = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) & ~31ull;
    if (first >= num_entries) return;
    const unsigned long long t = first + lane;
    bool start = false;
    unsigned int u = 0, end = 0;
    if (t < num_entries) {
        const unsigned int i = (unsigned int)t;
        u = sorted_rows[i];
        start = (i == 0 || sorted_rows[i - 1] != u) && u < num_rows;
        if (start) end = run_end(sorted_rows, num_entries, i);
    }
    const bool long_run = start && end - (unsigned int)t > SHORT_RUN;
    if (start && !long_run) {
        update_alone(sorted_pos, grads, dim, scale, kind, lr, eps, (unsigned int)t, end,
                     rows + (unsigned long long)u * dim, state + u);
    }
    for (unsigned int longs = __ballot_sync(0xffffffffu, long_run); longs != 0; longs &= longs - 1) {
        const unsigned int l = __ffs(longs) - 1;
        const unsigned int e = __shfl_sync(0xffffffffu, end, l);
        const unsigned int r = __shfl_sync(0xffffffffu, u, l);
        update_by_warp(sorted_pos, grads, partial, dim, chunk, split_min, scale, kind, lr, eps,
                       (unsigned int)first + l, e, rows + (unsigned long long)r * dim, state + r, g, lane);
    }
}
