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

#include <xshard/compiled.hpp>

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
XSHARD_DECL std::optional<std::string_view> tunable_value(std::string_view tunables,
                                                          std::string_view name) noexcept;

} // namespace detail

/// Has glibc's malloc keep freed blocks for reuse (see the file comment). Process-wide;
/// returns whether both settings took. It changes nothing, and returns false, off glibc,
/// when `XSHARD_KEEP_FREED_MEMORY` is `0`, or when the user set either threshold through the
/// environment already (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or
/// `glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`).
/// Other tunables combine with it: `glibc.malloc.hugetlb=1` puts the kept heap on
/// transparent huge pages (see `heap_on_huge_pages`).
XSHARD_DECL bool keep_freed_memory(heap_options o = {}) noexcept;

/// Whether the heap's memory comes in huge pages: glibc's malloc asks for them
/// (`glibc.malloc.hugetlb` set to 1, transparent huge pages, or 2, the reserved pool, in
/// `GLIBC_TUNABLES`; glibc 2.35 and later), or the kernel gives transparent huge pages to
/// every mapping (`always` in /sys/kernel/mm/transparent_hugepage/enabled). A step whose
/// work streams through memory runs faster on them (fewer TLB misses, a fault per 2 MiB):
/// docs/developer/performance.md.
XSHARD_DECL bool heap_on_huge_pages() noexcept;

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/heap.ipp>
#endif
