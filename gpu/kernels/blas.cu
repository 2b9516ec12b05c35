// Operand staging for the reduced-precision GEMMs (tf32, bf16): a row-major
// [rows x cols] matrix with row stride `ld_src` copied to one with row stride
// `ld_dst` (>= cols, a multiple of the tensor cores' 16-byte alignment), the
// columns past `cols` zeroed. The exact fp32 path never calls these.
//
// Every index is computed in 64 bits; every thread checks its bounds.

// dst = src as fp32 (tf32 operands: cuBLAS rounds them itself), or the
// padded result of a product copied back (`pad` 0: columns past `cols` of
// dst are left alone).
extern "C" __global__ void copy_rows_f32(const float* src, unsigned long long ld_src, unsigned int rows,
                                         unsigned int cols, unsigned long long ld_dst, int pad, float* dst) {
    const unsigned long long width = pad ? ld_dst : cols;
    const unsigned long long n = (unsigned long long)rows * width;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / width, c = i - r * width;
        dst[r * ld_dst + c] = c < cols ? src[r * ld_src + c] : 0.0f;
    }
}

// dst = bf16(src), rounded to nearest, ties to even, as the CPU's
// `round_bf16`: a denormal becomes a zero of its sign, a NaN a quiet NaN.
extern "C" __global__ void pack_rows_bf16(const float* src, unsigned long long ld_src, unsigned int rows,
                                          unsigned int cols, unsigned long long ld_dst, unsigned short* dst) {
    const unsigned long long n = (unsigned long long)rows * ld_dst;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / ld_dst, c = i - r * ld_dst;
        unsigned short h = 0;
        if (c < cols) {
            const unsigned int u = __float_as_uint(src[r * ld_src + c]);
            if ((u & 0x7fffffffu) > 0x7f800000u) {
                h = (unsigned short)((u >> 16) | 0x40u);
            } else if ((u & 0x7f800000u) == 0u) {
                h = (unsigned short)((u >> 16) & 0x8000u);
            } else {
                h = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            }
        }
        dst[i] = h;
    }
}
