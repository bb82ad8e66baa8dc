#pragma once
/// \file
/// The definitions of what comm/heap.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/heap.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::optional<std::string_view> tunable_value(std::string_view tunables,
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

XSHARD_DECL bool keep_freed_memory(heap_options o) noexcept {
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

XSHARD_DECL bool heap_on_huge_pages() noexcept {
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

