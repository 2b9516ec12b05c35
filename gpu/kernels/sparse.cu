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
// order) with their original positions (sorted_pos). One warp per sorted
// position; only the warp at the first entry of a row works. Each warp keeps
// its row's summed gradient in shared memory (dim floats per warp; the host
// sizes it as blockDim / 32 * dim floats).

extern "C" __global__ void sparse_update_rows(const unsigned int* sorted_rows, const unsigned int* sorted_pos,
                                              unsigned int num_entries, const float* grads, unsigned int dim,
                                              float scale, int kind, float lr, float eps, unsigned int num_rows,
                                              float* rows, float* state) {
    extern __shared__ float sums[];
    const unsigned int lane = threadIdx.x & 31;
    float* g = sums + (unsigned long long)(threadIdx.x >> 5) * dim;
    const unsigned long long warp_id = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp_id >= num_entries) return;
    const unsigned int i = (unsigned int)warp_id;
    const unsigned int u = sorted_rows[i];
    if (i > 0 && sorted_rows[i - 1] == u) return;
    if (u >= num_rows) return;
    for (unsigned int c = lane; c < dim; c += 32) {
        float acc = grads[(unsigned long long)sorted_pos[i] * dim + c];
        for (unsigned int j = i + 1; j < num_entries && sorted_rows[j] == u; ++j) {
            acc += grads[(unsigned long long)sorted_pos[j] * dim + c];
        }
        g[c] = acc * scale;
    }
    __syncwarp();
    float* w = rows + (unsigned long long)u * dim;
    if (kind == 0) {
        for (unsigned int c = lane; c < dim; c += 32) w[c] -= lr * g[c];
        return;
    }
    float step = 0.0f;
    if (lane == 0) {
        float sq = 0.0f;
        for (unsigned int c = 0; c < dim; ++c) sq += g[c] * g[c];
        const float a = state[u] + sq / (float)dim;
        state[u] = a;
        step = lr / (sqrtf(a) + eps);
    }
    step = __shfl_sync(0xffffffffu, step, 0);
    for (unsigned int c = lane; c < dim; c += 32) w[c] -= step * g[c];
}
