#pragma once
/// \file
/// The definitions of what io/staged_save.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/staged_save.hpp>

namespace xshard::detail {

XSHARD_DECL file stage_temporary(const std::string& path, temporary_kind kind) {
    replaceable(path);
    create_parent_directories(path);
    remove_stale_temporaries(path);
    return kind == temporary_kind::file ? create_temporary_file(path)
                                        : create_temporary_directory(path);
}

XSHARD_DECL void remove_temporary(const std::string& tmp, temporary_kind kind) noexcept {
    if (kind == temporary_kind::file)
        ::unlink(tmp.c_str());
    else
        remove_temporary_directory(tmp);
}

} // namespace xshard::detail

