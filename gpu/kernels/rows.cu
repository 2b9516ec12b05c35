// Rows of a table copied to or from a list of row numbers, bit for bit (no
// arithmetic): what the host reads back of a device's rows (width dim) and
// their optimizer state (width 1), and what a restore writes. The host has
// checked every row number against the table; every index is 64-bit.

// out[i * width + c] = src[rows_of[i] * width + c] for i < n, c < width.
extern "C" __global__ void gather_rows(const float* src, unsigned int width, const unsigned int* rows_of,
                                       unsigned long long n, float* out) {
    const unsigned long long total = n * width;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / width, c = i - r * width;
        out[i] = src[(unsigned long long)rows_of[r] * width + c];
    }
}

// dst[rows_of[i] * width + c] = values[i * width + c] for i < n, c < width.
// The row numbers are distinct (a row written twice would race).
extern "C" __global__ void scatter_rows(float* dst, unsigned int width, const unsigned int* rows_of,
                                        unsigned long long n, const float* values) {
    const unsigned long long total = n * width;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / width, c = i - r * width;
        dst[(unsigned long long)rows_of[r] * width + c] = values[i];
    }
}
