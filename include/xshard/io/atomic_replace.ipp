#pragma once
/// \file
/// The definitions of what io/atomic_replace.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/atomic_replace.hpp>

namespace xshard::detail {

XSHARD_DECL existing replaceable(const std::string& path) {
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

XSHARD_DECL void remove_checkpoint(const std::string& path) {
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

XSHARD_DECL void remove_temporary_directory(const std::string& dir) noexcept {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (checkpoint_file_name(e.path().filename().string()))
            ::unlink(e.path().c_str());
    ::rmdir(dir.c_str());
}

XSHARD_DECL bool temporary_suffix(std::string_view suffix, bool directory) {
    const std::string_view allowed =
        directory ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                  : "0123456789abcdef";
    return suffix.size() == (directory ? 6u : 16u) &&
           suffix.find_first_not_of(allowed) == std::string_view::npos;
}

XSHARD_DECL void remove_stale_temporaries(const std::string& path) noexcept {
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

XSHARD_DECL std::string previous_name(const std::string& path) {
    return path + ".old";
}

XSHARD_DECL void replace_checkpoint(const std::string& tmp, const std::string& path,
                                    bool remove_old) {
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

