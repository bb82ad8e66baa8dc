#pragma once
/// \file
/// Replacing a checkpoint without ever being left with none, and cleaning up after saves that
/// were killed. A save writes its checkpoint under a temporary name beside the destination
/// (staged_save.hpp), then puts it in place with renames (replace_checkpoint: one rename for a
/// file; for a directory, the previous one renamed `<path>.old` for the moment of the swap,
/// which readers fall back to). Nothing that is not a checkpoint of xshard's is ever replaced
/// or removed (replaceable), and the temporaries of killed saves are removed once provably
/// abandoned (remove_stale_temporaries).

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/stored_blocks.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard::detail {

/// What is at a path a save is about to replace.
enum class existing { nothing, file, checkpoint_directory };

/// What `path` holds, when a save may replace it: nothing, an integrated checkpoint of
/// xshard's (a safetensors file whose metadata says "format": "xshard"), or a per-rank
/// checkpoint directory of xshard's (only files of its names, and a checkpoint.json that says
/// so; or empty). Throws io_error for anything else (a link, a user's directory or file, an
/// empty file, another program's safetensors file): xshard never removes what is not a
/// checkpoint of its own.
XSHARD_DECL existing replaceable(const std::string& path);

/// Removes the checkpoint at `path` (after `replaceable` said what it is): a file, or the
/// files of xshard's names in a directory and then the directory. Nothing else is removed.
/// The files' blocks are freed in the background (hold_open).
XSHARD_DECL void remove_checkpoint(const std::string& path);

/// Removes a temporary directory a failed save created (mkdtemp: nobody else's): the files of
/// xshard's names in it, then it, if empty. Never throws (it runs during unwinding).
XSHARD_DECL void remove_temporary_directory(const std::string& dir) noexcept;

/// How long a temporary must have stayed unmodified before a save takes it for stale.
inline constexpr std::time_t stale_after_seconds = 3600;

/// True when `suffix` is what create_temporary_file (16 hexadecimal digits, `directory`
/// false) or create_temporary_directory (mkdtemp's 6 letters and digits) puts after ".tmp-".
XSHARD_DECL bool temporary_suffix(std::string_view suffix, bool directory);

/// Removes the temporaries of saves to `path` that were killed: the entries beside it named
/// as create_temporary_file or create_temporary_directory names them, that are a regular
/// file or a directory (never a link, never followed), owned by this user, unmodified for
/// stale_after_seconds and not held by any process (see hold; the lock is taken before the
/// removal, so a save in progress never loses its temporary). Of a directory, only the files
/// of a checkpoint's names are removed, then the directory if that empties it. Never throws:
/// what cannot be removed stays.
XSHARD_DECL void remove_stale_temporaries(const std::string& path) noexcept;

/// Where a save puts the checkpoint it replaces for the moment of the swap.
XSHARD_DECL std::string previous_name(const std::string& path);

/// Puts the complete, synced checkpoint `tmp` (a file or a per-rank directory) in place of
/// `path` without ever leaving no complete checkpoint: a file over a file is one rename; a
/// directory is swapped through <path>.old (a process killed between the two renames leaves
/// <path>.old, which readers fall back to and the next save puts back first). The previous
/// checkpoint is removed unless `remove_old` is false (the caller then removes
/// previous_name(path)); its blocks are freed in the background (hold_open). Throws
/// io_error, replacing nothing, when `path` (or <path>.old) holds something that is not an
/// xshard checkpoint.
XSHARD_DECL void replace_checkpoint(const std::string& tmp, const std::string& path,
                                    bool remove_old = true);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/atomic_replace.ipp>
#endif
