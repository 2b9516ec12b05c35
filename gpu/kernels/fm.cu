// The factorization machine's second-order term over field rows
// `rows[(b * num_fields + f) * stride + offset + c]`, c < dim.
//
// Forward: one thread per sample, in the CPU's order exactly (per field the
// factor's values added to the column sums and their squares to one running
// sum; then the squared column sums in column order).
// Backward: one thread per (sample, column): the column sum over fields in
// field order, then drows += g * (sum - v) for every field (added, other
// columns untouched, as on the CPU).

extern "C" __global__ void fm_forward(const float* rows, unsigned int batch, unsigned int num_fields, unsigned int dim,
                                      unsigned int stride, unsigned int offset, float* sum_scratch, float* out) {
    const unsigned int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    // The column sums live in this sample's slice of `sum_scratch` ([batch x dim]).
    float* sum = sum_scratch + (unsigned long long)b * dim;
    for (unsigned int c = 0; c < dim; ++c) sum[c] = 0.0f;
    float squares = 0.0f;
    for (unsigned int f = 0; f < num_fields; ++f) {
        const float* v = rows + ((unsigned long long)b * num_fields + f) * stride + offset;
        for (unsigned int c = 0; c < dim; ++c) {
            const float x = v[c];
            sum[c] += x;
            squares += x * x;
        }
    }
    float total = 0.0f;
    for (unsigned int c = 0; c < dim; ++c) total += sum[c] * sum[c];
    out[b] = 0.5f * (total - squares);
}

extern "C" __global__ void fm_backward(const float* rows, const float* dout, unsigned int batch,
                                       unsigned int num_fields, unsigned int dim, unsigned int stride,
                                       unsigned int offset, float* drows) {
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (unsigned long long)batch * dim) return;
    const unsigned int b = (unsigned int)(k / dim), c = (unsigned int)(k % dim);
    float sum = 0.0f;
    for (unsigned int f = 0; f < num_fields; ++f) {
        sum += rows[((unsigned long long)b * num_fields + f) * stride + offset + c];
    }
    const float g = dout[b];
    for (unsigned int f = 0; f < num_fields; ++f) {
        const unsigned long long at = ((unsigned long long)b * num_fields + f) * stride + offset + c;
        drows[at] += g * (sum - rows[at]);
    }
}
