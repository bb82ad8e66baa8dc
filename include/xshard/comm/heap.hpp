#pragma once
/// \file
/// How the process's heap treats freed blocks: kept for reuse rather than given back to the
/// system. A training step allocates and frees the same activation-sized blocks every step.
/// By default glibc maps each block of 128 KiB or more on its own (raising that threshold to
/// the largest block freed so far, up to 32 MiB) and returns free memory at its heap's top
/// beyond twice it, so every step maps its blocks again and pays one page fault per 4 KiB
/// page touched. Kept, the blocks are reused from the heap: one rank's step of the f32
/// transformer block of `bench_training` went from 0.24 s to 0.13 s on a 2-core AMD EPYC
/// (benchmarks/README.md, "Against PyTorch").
///
/// The price: the resident set stays near the largest the process reached (up to the trim
/// threshold of free memory at the heap's top); blocks larger than the mmap threshold are
/// still mapped and unmapped on their own. `xshard::environment` applies `keep_freed_memory()`
/// at construction unless the environment says otherwise (see there).

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace xshard {

/// What `keep_freed_memory` sets (glibc's mallopt parameters).
struct heap_options {
    /// Blocks up to this many bytes come from the heap (M_MMAP_THRESHOLD; 32 MiB is the
    /// largest glibc accepts on 64-bit systems). Fixing it also stops glibc's own raising.
    std::size_t mmap_threshold = std::size_t(32) << 20;
    /// Free bytes at the heap's top kept rather than returned (M_TRIM_THRESHOLD).
    std::size_t trim_threshold = std::size_t(512) << 20;
};

/// Has glibc's malloc keep freed blocks for reuse (see the file comment). Process-wide;
/// returns whether both settings took. It changes nothing, and returns false, off glibc,
/// when `XSHARD_KEEP_FREED_MEMORY` is `0`, or when the user tuned malloc through the
/// environment already (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or
/// `GLIBC_TUNABLES`).
inline bool keep_freed_memory(heap_options o = {}) noexcept {
#if defined(__GLIBC__)
    if (const char* v = std::getenv("XSHARD_KEEP_FREED_MEMORY"); v && std::string_view(v) == "0")
        return false;
    for (const char* user : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"})
        if (std::getenv(user))
            return false;
    auto as_int = [](std::size_t n) {
        return int(std::min<std::size_t>(n, INT_MAX));
    };
    const bool mapped = mallopt(M_MMAP_THRESHOLD, as_int(o.mmap_threshold)) == 1;
    const bool trimmed = mallopt(M_TRIM_THRESHOLD, as_int(o.trim_threshold)) == 1;
    return mapped && trimmed;
#else
    (void)o;
    return false;
#endif
}

} // namespace xshard
