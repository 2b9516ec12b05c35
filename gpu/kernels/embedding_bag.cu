// Embedding-bag pooling of one field over gathered rows, and its gradient.
//
// `unique` is [num_unique x dim]; bag b holds the entries k in
// [offsets[b], offsets[b + 1]) and refers to row index[k]. Pooling writes
//   pooled[(b * num_fields + field) * dim + c] = sum over k of w_k * unique[index[k] * dim + c]
// summed in k order from zero, where w_k is weights[k] (mode 2), 1 / n for a
// bag of n entries (mode 1, mean) or 1 with no product at all (mode 0, sum),
// as the CPU's `pool_sum`. An empty bag pools to zeros. The host has checked
// the offsets and indices before any launch here; the kernels still skip an
// out-of-range row rather than read past the buffer.

__device__ __forceinline__ float entry_weight(int mode, const float* weights, unsigned int k, unsigned int n) {
    return mode == 2 ? weights[k] : 1.0f / (float)n;
}

// One block per bag, threads over the columns.
extern "C" __global__ void pool_forward(const float* unique, unsigned int num_unique, unsigned int dim,
                                        const unsigned int* offsets, const unsigned int* index,
                                        const float* weights, int mode, unsigned int batch, unsigned int field,
                                        unsigned int num_fields, float* pooled) {
    const unsigned int b = blockIdx.x;
    if (b >= batch) return;
    const unsigned int lo = offsets[b], hi = offsets[b + 1];
    float* out = pooled + ((unsigned long long)b * num_fields + field) * dim;
    for (unsigned int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.0f;
        for (unsigned int k = lo; k < hi; ++k) {
            const unsigned int u = index[k];
            if (u >= num_unique) continue;
            const float r = unique[(unsigned long long)u * dim + c];
            if (mode == 0) {
                acc += r;
            } else {
                acc += entry_weight(mode, weights, k, hi - lo) * r;
            }
        }
        out[c] = acc;
    }
}

// bag_of[k] = b for every entry k of bag b (one thread per bag).
extern "C" __global__ void entry_bags(const unsigned int* offsets, unsigned int batch, unsigned int* bag_of) {
    for (unsigned int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch; b += gridDim.x * blockDim.x) {
        for (unsigned int k = offsets[b]; k < offsets[b + 1]; ++k) bag_of[k] = b;
    }
}

// The adjoint of pool_forward, added into dunique. The entries arrive sorted
// by row (sorted_rows) with their original positions (sorted_pos), equal rows
// in entry order. One warp per sorted position; the warp at the first entry
// of a row reduces the row's entries in entry order onto the row's current
// gradient, element by element as the CPU does
// (dunique[u] += w_k * dpooled[bag(k)] for k ascending), and writes it once.
extern "C" __global__ void pool_backward_rows(const float* dpooled, unsigned int dim, const unsigned int* offsets,
                                              const unsigned int* bag_of, const unsigned int* sorted_rows,
                                              const unsigned int* sorted_pos, unsigned int num_entries,
                                              const float* weights, int mode, unsigned int field,
                                              unsigned int num_fields, unsigned int num_unique, float* dunique) {
    const unsigned long long warp_id = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31;
    if (warp_id >= num_entries) return;
    const unsigned int i = (unsigned int)warp_id;
    const unsigned int u = sorted_rows[i];
    if (i > 0 && sorted_rows[i - 1] == u) return;
    if (u >= num_unique) return;
    for (unsigned int c = lane; c < dim; c += 32) {
        float acc = dunique[(unsigned long long)u * dim + c];
        for (unsigned int j = i; j < num_entries && sorted_rows[j] == u; ++j) {
            const unsigned int k = sorted_pos[j];
            const unsigned int b = bag_of[k];
            const float g = dpooled[((unsigned long long)b * num_fields + field) * dim + c];
            if (mode == 0) {
                acc += g;
            } else {
                acc += entry_weight(mode, weights, k, offsets[b + 1] - offsets[b]) * g;
            }
        }
        dunique[(unsigned long long)u * dim + c] = acc;
    }
}
