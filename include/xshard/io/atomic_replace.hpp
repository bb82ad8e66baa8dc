#pragma once
/// \file
/// Replacing a checkpoint without ever being left with none, and cleaning up after saves that
/// were killed. A save writes its checkpoint under a temporary name beside the destination
/// (staged_save.hpp), then puts it in place with renames (replace_checkpoint: one rename for a
/// file; for a directory, the previous one renamed `<path>.old` for the moment of the swap,
/// which readers fall back to). Nothing that is not a checkpoint of xshard's is ever replaced
/// or removed (replaceable), and the temporaries of killed saves are removed once provably
/// abandoned (remove_stale_temporaries).

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
inline existing replaceable(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::symlink_status(path, ec);
    if (ec && st.type() != fs::file_type::not_found)
        throw io_error("xshard: cannot inspect " + path + ": " + ec.message());
    const auto refuse = [&](const std::string& why) {
        return io_error("xshard: " + path + " " + why +
                        "; xshard replaces only its own checkpoints");
    };
    switch (st.type()) {
    case fs::file_type::not_found:
        return existing::nothing;
    case fs::file_type::regular: {
        std::string format;
        try {
            const file f(path, O_RDONLY | O_NOFOLLOW);
            const auto h = read_header(f);
            if (const auto it = h.metadata.find("format"); it != h.metadata.end())
                format = it->second;
        } catch (const io_error&) {
            throw refuse("is not a safetensors file");
        }
        // (Another program's safetensors file is the user's data, not a checkpoint of ours.)
        if (format != "xshard")
            throw refuse("is a safetensors file that xshard did not write");
        return existing::file;
    }
    case fs::file_type::directory: {
        std::size_t entries = 0;
        for (const auto& e : fs::directory_iterator(path, ec)) {
            ++entries;
            if (!checkpoint_file_name(e.path().filename().string()) || !e.is_regular_file() ||
                e.is_symlink())
                throw refuse("holds " + e.path().filename().string() +
                             ", which is not part of an xshard checkpoint");
        }
        if (ec)
            throw io_error("xshard: cannot list " + path + ": " + ec.message());
        if (entries == 0)
            return existing::checkpoint_directory;
        try {
            const auto j = nlohmann::json::parse(read_file(path + "/checkpoint.json"));
            if (j.is_object() && j.value("format", "") == checkpoint_json_kind.format)
                return existing::checkpoint_directory;
        } catch (const std::exception&) {
        }
        throw refuse("is a directory without an xshard checkpoint.json");
    }
    case fs::file_type::symlink:
        throw refuse("is a symbolic link");
    default:
        throw refuse("is not a regular file or directory");
    }
}

/// Removes the checkpoint at `path` (after `replaceable` said what it is): a file, or the
/// files of xshard's names in a directory and then the directory. Nothing else is removed.
/// The files' blocks are freed in the background (hold_open).
inline void remove_checkpoint(const std::string& path) {
    namespace fs = std::filesystem;
    const auto kind = replaceable(path);
    if (kind == existing::nothing)
        return;
    std::vector<file> held; // freed in the background (hold_open)
    const auto remove = [&](const std::string& name) {
        if (auto f = hold_open(name))
            held.push_back(std::move(*f));
        if (::unlink(name.c_str()) != 0 && errno != ENOENT)
            io_fail("cannot remove", name);
    };
    if (kind == existing::checkpoint_directory) {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(path))
            names.push_back(e.path().string());
        for (const auto& n : names)
            remove(n);
        if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
            io_fail("cannot remove", path);
    } else {
        remove(path);
    }
    close_in_background(std::move(held));
}

/// Removes a temporary directory a failed save created (mkdtemp: nobody else's): the files of
/// xshard's names in it, then it, if empty. Never throws (it runs during unwinding).
inline void remove_temporary_directory(const std::string& dir) noexcept {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (checkpoint_file_name(e.path().filename().string()))
            ::unlink(e.path().c_str());
    ::rmdir(dir.c_str());
}

/// How long a temporary must have stayed unmodified before a save takes it for stale.
inline constexpr std::time_t stale_after_seconds = 3600;

/// True when `suffix` is what create_temporary_file (16 hexadecimal digits, `directory`
/// false) or create_temporary_directory (mkdtemp's 6 letters and digits) puts after ".tmp-".
inline bool temporary_suffix(std::string_view suffix, bool directory) {
    const std::string_view allowed =
        directory ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                  : "0123456789abcdef";
    return suffix.size() == (directory ? 6u : 16u) &&
           suffix.find_first_not_of(allowed) == std::string_view::npos;
}

/// Removes the temporaries of saves to `path` that were killed: the entries beside it named
/// as create_temporary_file or create_temporary_directory names them, that are a regular
/// file or a directory (never a link, never followed), owned by this user, unmodified for
/// stale_after_seconds and not held by any process (see hold; the lock is taken before the
/// removal, so a save in progress never loses its temporary). Of a directory, only the files
/// of a checkpoint's names are removed, then the directory if that empties it. Never throws:
/// what cannot be removed stays.
inline void remove_stale_temporaries(const std::string& path) noexcept {
    namespace fs = std::filesystem;
    try {
        const fs::path p(path);
        const auto dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
        const std::string prefix = p.filename().string() + ".tmp-";
        std::vector<std::string> names;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            auto name = e.path().filename().string();
            if (name.size() > prefix.size() && name.starts_with(prefix))
                names.push_back(std::move(name));
        }
        for (const auto& name : names) {
            const auto full = (dir / name).string();
            const auto suffix = std::string_view(name).substr(prefix.size());
            struct stat st {};
            if (::lstat(full.c_str(), &st) != 0 || st.st_uid != ::geteuid() ||
                std::time(nullptr) - st.st_mtime < stale_after_seconds)
                continue;
            const bool is_file = S_ISREG(st.st_mode) && temporary_suffix(suffix, false);
            const bool is_dir = S_ISDIR(st.st_mode) && temporary_suffix(suffix, true);
            if (!is_file && !is_dir)
                continue;
            const int fd = ::open(full.c_str(),
                                  O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
            if (fd < 0)
                continue;
            const auto held = file::adopt(fd, full);
            struct stat now {};
            if (::fstat(fd, &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev ||
                ::flock(fd, LOCK_EX | LOCK_NB) != 0)
                continue; // replaced meanwhile, or a save holds it
            if (is_file)
                ::unlink(full.c_str());
            else
                remove_temporary_directory(full);
        }
    } catch (...) {
    }
}

/// Where a save puts the checkpoint it replaces for the moment of the swap.
inline std::string previous_name(const std::string& path) {
    return path + ".old";
}

/// Puts the complete, synced checkpoint `tmp` (a file or a per-rank directory) in place of
/// `path` without ever leaving no complete checkpoint: a file over a file is one rename; a
/// directory is swapped through <path>.old (a process killed between the two renames leaves
/// <path>.old, which readers fall back to and the next save puts back first). The previous
/// checkpoint is removed unless `remove_old` is false (the caller then removes
/// previous_name(path)); its blocks are freed in the background (hold_open). Throws
/// io_error, replacing nothing, when `path` (or <path>.old) holds something that is not an
/// xshard checkpoint.
inline void replace_checkpoint(const std::string& tmp, const std::string& path,
                               bool remove_old = true) {
    const std::string old = previous_name(path);
    auto now = replaceable(path);
    if (now == existing::nothing && replaceable(old) != existing::nothing) {
        commit_rename(old, path); // finish the swap a killed save left half done
        now = replaceable(path);
    }
    remove_checkpoint(old);
    const bool is_file = std::filesystem::is_regular_file(tmp);
    if (now == existing::nothing || (is_file && now == existing::file)) {
        std::vector<file> previous; // freed in the background (hold_open)
        if (auto f = now == existing::file ? hold_open(path) : std::nullopt)
            previous.push_back(std::move(*f));
        commit_rename(tmp, path);
        close_in_background(std::move(previous));
        return;
    }
    commit_rename(path, old);
    commit_rename(tmp, path);
    if (remove_old)
        remove_checkpoint(old);
}

} // namespace xshard::detail
