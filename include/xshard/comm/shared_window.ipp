#pragma once
/// \file
/// The definitions of what comm/shared_window.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/shared_window.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL bool may_make_shared_file(std::size_t bytes) {
    const std::size_t need = bytes + (std::size_t(1) << 20);
    rlimit limit{};
    if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        limit.rlim_cur < need)
        return false;
    struct statvfs fs {};
    return ::statvfs("/dev/shm", &fs) != 0 || std::size_t(fs.f_bavail) * fs.f_frsize >= need;
}

} // namespace detail

} // namespace xshard

