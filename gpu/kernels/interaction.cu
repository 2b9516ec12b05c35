// DLRM's dot interaction, one block per sample.
//
// Per sample the vectors are z_0 = dense[b] (the bottom MLP's output) and
// z_1..z_F = pooled[b, f] (the pooled embeddings), n = F + 1 vectors of width
// d. The output row is z_0 followed by the dot products <z_i, z_j> in the
// order of the pair table (`pair_i`, `pair_j`, built on the host in the CPU's
// order: lower triangle row by row, the diagonal inside each row with
// self-interaction, <z_0, z_0> last). Each dot product sums c = 0..d-1 in
// order, as the CPU's definition does.
//
// Shared memory: z (n rows of d floats, d | 1 apart, so that the threads of a
// warp reading different rows at one column hit different banks) in the
// forward; z (n * d floats) and the symmetric pair gradient S (n * n floats)
// in the backward. The host checks that it fits.

extern "C" __global__ void interaction_forward(const float* dense, const float* pooled, const unsigned int* pair_i,
                                               const unsigned int* pair_j, unsigned int batch, unsigned int num_sparse,
                                               unsigned int d, unsigned int num_pairs, float* out) {
    extern __shared__ float z[];
    const unsigned int b = blockIdx.x;
    if (b >= batch) return;
    const unsigned int n = num_sparse + 1;
    const unsigned long long od = (unsigned long long)d + num_pairs;
    const unsigned long long fd = (unsigned long long)num_sparse * d;
    const unsigned int ld = d | 1;
    for (unsigned int k = threadIdx.x; k < n * d; k += blockDim.x) {
        const unsigned int r = k / d, c = k - r * d;
        z[r * ld + c] = k < d ? dense[(unsigned long long)b * d + k] : pooled[(unsigned long long)b * fd + (k - d)];
    }
    __syncthreads();
    float* row = out + (unsigned long long)b * od;
    for (unsigned int k = threadIdx.x; k < d; k += blockDim.x) {
        row[k] = z[k];
    }
    for (unsigned int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
        const float* zi = z + (unsigned long long)pair_i[p] * ld;
        const float* zj = z + (unsigned long long)pair_j[p] * ld;
        float acc = 0.0f;
        for (unsigned int c = 0; c < d; ++c) {
            acc += zi[c] * zj[c];
        }
        row[d + p] = acc;
    }
}

// ddense[b] and dpooled[b] (overwritten) from dout[b]: dZ = S . Z plus dout's
// copy of z_0 on row 0, where S[i][j] = S[j][i] = dout of pair (i, j) and a
// diagonal pair counts twice. Each element of dZ sums j = 0..n-1 in order,
// then adds the copied gradient, as the CPU does.
extern "C" __global__ void interaction_backward(const float* dense, const float* pooled, const float* dout,
                                                const unsigned int* pair_i, const unsigned int* pair_j,
                                                unsigned int batch, unsigned int num_sparse, unsigned int d,
                                                unsigned int num_pairs, float* ddense, float* dpooled) {
    extern __shared__ float smem[];
    const unsigned int b = blockIdx.x;
    if (b >= batch) return;
    const unsigned int n = num_sparse + 1;
    float* z = smem;
    float* s = smem + (unsigned long long)n * d;
    const unsigned long long od = (unsigned long long)d + num_pairs;
    const unsigned long long fd = (unsigned long long)num_sparse * d;
    const float* g = dout + (unsigned long long)b * od;
    for (unsigned int k = threadIdx.x; k < n * d; k += blockDim.x) {
        z[k] = k < d ? dense[(unsigned long long)b * d + k] : pooled[(unsigned long long)b * fd + (k - d)];
    }
    for (unsigned int k = threadIdx.x; k < n * n; k += blockDim.x) {
        s[k] = 0.0f;
    }
    __syncthreads();
    for (unsigned int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
        const unsigned int i = pair_i[p], j = pair_j[p];
        const float v = g[d + p];
        if (i == j) {
            s[i * n + i] = v + v;
        } else {
            s[i * n + j] = v;
            s[j * n + i] = v;
        }
    }
    __syncthreads();
    for (unsigned int k = threadIdx.x; k < n * d; k += blockDim.x) {
        const unsigned int r = k / d, c = k % d;
        float acc = 0.0f;
        for (unsigned int j = 0; j < n; ++j) {
            acc += s[r * n + j] * z[j * d + c];
        }
        if (r == 0) {
            ddense[(unsigned long long)b * d + c] = acc + g[c];
        } else {
            dpooled[(unsigned long long)b * fd + (k - d)] = acc;
        }
    }
}
