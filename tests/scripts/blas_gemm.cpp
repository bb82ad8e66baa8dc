// A single- and a double-precision GEMM through the BLAS xshard links, compared with a
// plain loop. Run under scripts/env.sh, it fails (SIGILL) where the scripts force kernels
// the CPU cannot run. Prints the kernels OpenBLAS chose.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <vector>

// OpenBLAS's own entry point; absent (null) under another BLAS.
extern "C" char* openblas_get_corename() __attribute__((weak));

namespace {

template <class T, class Gemm>
bool check(const char* name, Gemm gemm, double tolerance)
{
    constexpr int m = 67, n = 45, k = 131;  // sizes that leave remainders in every kernel
    std::vector<T> a(m * k), b(k * n), c(m * n, T(0));
    for (int i = 0; i < m * k; ++i) a[i] = T((i * 7 % 13) - 6) / T(8);
    for (int i = 0; i < k * n; ++i) b[i] = T((i * 5 % 11) - 5) / T(4);
    gemm(m, n, k, a.data(), b.data(), c.data());
    double worst = 0;
    for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
            double expect = 0;
            for (int l = 0; l < k; ++l) expect += double(a[i * k + l]) * double(b[l * n + j]);
            worst = std::fmax(worst, std::fabs(expect - double(c[i * n + j])));
        }
    }
    std::printf("%s %dx%dx%d: largest error %.3g (tolerance %.3g)\n", name, m, n, k, worst,
                tolerance);
    return worst <= tolerance;
}

}  // namespace

int main()
{
    std::printf("OpenBLAS kernels: %s\n",
                openblas_get_corename ? openblas_get_corename() : "(not OpenBLAS)");
    bool ok = check<float>(
        "sgemm",
        [](int m, int n, int k, const float* a, const float* b, float* c) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n,
                        0.0f, c, n);
        },
        1e-3);
    ok = check<double>(
             "dgemm",
             [](int m, int n, int k, const double* a, const double* b, double* c) {
                 cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, k, b,
                             n, 0.0, c, n);
             },
             1e-12) &&
         ok;
    std::puts(ok ? "gemm: ok" : "gemm: WRONG");
    return ok ? 0 : 1;
}
