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
///
/// glibc 2.35 and later put the heap on transparent huge pages when launched with
/// `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`: a pass over an array then misses the TLB once per
/// 2 MiB rather than per 4 KiB. At 2 ranks of a 2-core AMD EPYC the MLP's and the transformer
/// block's f32 steps of `bench_training` ran 11-14 % faster (docs/developer/performance.md).

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
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

namespace detail {

/// The value `tunables`, the text of GLIBC_TUNABLES ("name=value:name=value..."), gives
/// `name` (the last, as glibc reads them); nothing when it does not set it.
inline std::optional<std::string_view> tunable_value(std::string_view tunables,
                                                     std::string_view name) noexcept {
    std::optional<std::string_view> value;
    for (;;) {
        const auto end = tunables.find(':');
        const auto item = tunables.substr(0, end);
        const auto eq = item.find('=');
        if (eq != std::string_view::npos && item.substr(0, eq) == name)
            value = item.substr(eq + 1);
        if (end == std::string_view::npos)
            return value;
        tunables.remove_prefix(end + 1);
    }
}

} // namespace detail

/// Has glibc's malloc keep freed blocks for reuse (see the file comment). Process-wide;
/// returns whether both settings took. It changes nothing, and returns false, off glibc,
/// when `XSHARD_KEEP_FREED_MEMORY` is `0`, or when the user set either threshold through the
/// environment already (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or
/// `glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`).
/// Other tunables combine with it: `glibc.malloc.hugetlb=1` puts the kept heap on
/// transparent huge pages (see `heap_on_huge_pages`).
inline bool keep_freed_memory(heap_options o = {}) noexcept {
#if defined(__GLIBC__)
    if (const char* v = std::getenv("XSHARD_KEEP_FREED_MEMORY"); v && std::string_view(v) == "0")
        return false;
    for (const char* user : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
        if (std::getenv(user))
            return false;
    if (const char* t = std::getenv("GLIBC_TUNABLES"))
        for (const char* user : {"glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"})
            if (detail::tunable_value(t, user))
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

/// Whether the heap's memory comes in huge pages: glibc's malloc asks for them
/// (`glibc.malloc.hugetlb` set to 1, transparent huge pages, or 2, the reserved pool, in
/// `GLIBC_TUNABLES`; glibc 2.35 and later), or the kernel gives transparent huge pages to
/// every mapping (`always` in /sys/kernel/mm/transparent_hugepage/enabled). A step whose
/// work streams through memory runs faster on them (fewer TLB misses, a fault per 2 MiB):
/// docs/developer/performance.md.
inline bool heap_on_huge_pages() noexcept {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
    if (const char* t = std::getenv("GLIBC_TUNABLES"))
        if (const auto v = detail::tunable_value(t, "glibc.malloc.hugetlb"); v == "1" || v == "2")
            return true;
#endif
    std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return false;
    char line[128] = {};
    const bool read = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    return read && std::string_view(line).find("[always]") != std::string_view::npos;
}

} // namespace xshard
