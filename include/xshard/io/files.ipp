#pragma once
/// \file
/// The definitions of what io/files.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/files.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL void io_fail(const std::string& what, const std::string& path) {
    throw io_error("xshard: " + what + " " + path + ": " + std::strerror(errno));
}

XSHARD_DECL file::file(const std::string& path, int flags, mode_t mode)
    : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd_ < 0)
        io_fail("cannot open", path);
}

XSHARD_DECL file::file(const file& dir, const std::string& name, int flags)
    : path_(dir.path() + "/" + name) {
    fd_ = ::openat(dir.fd(), name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
    if (fd_ < 0)
        io_fail("cannot open", path_);
}

XSHARD_DECL file file::adopt(int fd, std::string path) {
    file f;
    f.fd_ = fd;
    f.path_ = std::move(path);
    return f;
}

XSHARD_DECL void file::close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0)
        io_fail("cannot close", path_);
}

XSHARD_DECL std::size_t file::size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
        io_fail("cannot stat", path_);
    return std::size_t(st.st_size);
}

XSHARD_DECL void file::read_scattered_at(std::span<::iovec> parts, std::size_t offset) const {
    while (!parts.empty()) {
        if (parts.front().iov_len == 0) {
            parts = parts.subspan(1);
            continue;
        }
        const auto count = int(std::min<std::size_t>(parts.size(), IOV_MAX));
        const auto got = ::preadv(fd_, parts.data(), count, off_t(offset));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            io_fail("cannot read", path_);
        if (got == 0)
            throw io_error("xshard: " + path_ + " is truncated");
        offset += std::size_t(got);
        advance(parts, std::size_t(got));
    }
}

XSHARD_DECL void file::write_gathered_at(std::span<::iovec> parts, std::size_t offset) const {
    while (!parts.empty()) {
        if (parts.front().iov_len == 0) {
            parts = parts.subspan(1);
            continue;
        }
        const auto count = int(std::min<std::size_t>(parts.size(), IOV_MAX));
        const auto put = ::pwritev(fd_, parts.data(), count, off_t(offset));
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            io_fail("cannot write", path_);
        offset += std::size_t(put);
        advance(parts, std::size_t(put));
    }
}

XSHARD_DECL bool file::reserve(std::size_t offset, std::size_t n) const {
#ifdef __linux__
    rlimit limit{};
    if (n > 0 && ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        checked_add(offset, n) > limit.rlim_cur) {
        errno = EFBIG;
        io_fail("cannot allocate " + std::to_string(n) + " bytes in", path_);
    }
    while (n > 0 && ::fallocate(fd_, 0, off_t(offset), off_t(n)) != 0) {
        if (errno == EINTR)
            continue;
        if (errno == EOPNOTSUPP || errno == ENOSYS)
            return false;
        io_fail("cannot allocate " + std::to_string(n) + " bytes in", path_);
    }
    return true;
#else
    (void)offset;
    (void)n;
    return false;
#endif
}

XSHARD_DECL void file::write_back(std::size_t offset, std::size_t n, bool wait) const {
#ifdef __linux__
    const unsigned flags =
        wait ? SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
             : SYNC_FILE_RANGE_WRITE;
    if (n > 0 && ::sync_file_range(fd_, off_t(offset), off_t(n), flags) != 0)
        io_fail("cannot write back", path_);
#else
    (void)offset;
    (void)n;
    if (wait)
        sync();
#endif
}

XSHARD_DECL void file::advance(std::span<::iovec>& parts, std::size_t done) noexcept {
    while (done > 0) {
        auto& p = parts.front();
        const auto k = std::min(done, p.iov_len);
        p.iov_base = static_cast<char*>(p.iov_base) + k;
        p.iov_len -= k;
        done -= k;
        if (p.iov_len == 0)
            parts = parts.subspan(1);
    }
}

XSHARD_DECL void sync_directory_of(const std::string& path) {
    auto dir = std::filesystem::path(path).parent_path();
    if (dir.empty())
        dir = ".";
    file d(dir.string(), O_RDONLY | O_DIRECTORY);
    ::fsync(d.fd());
}

XSHARD_DECL void commit_rename(const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0)
        io_fail("cannot rename " + from + " to", to);
    sync_directory_of(to);
}

XSHARD_DECL std::optional<file> hold_open(const std::string& path) noexcept {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return std::nullopt;
    auto f = file::adopt(fd, path);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return std::nullopt;
    return f;
}

XSHARD_DECL void close_in_background(std::vector<file> files) noexcept {
    if (files.empty())
        return;
    try {
        std::thread([held = std::move(files)] {}).detach(); // their destructors close them
    } catch (...) {
        // the lambda (and the files it holds) is destroyed here: closed now
    }
}

XSHARD_DECL std::string random_suffix() {
    static thread_local std::mt19937_64 engine{std::random_device{}() ^
                                               (std::uint64_t(::getpid()) << 32)};
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(engine()));
    return text;
}

XSHARD_DECL void create_parent_directories(const std::string& path) {
    const auto dir = std::filesystem::path(path).parent_path();
    if (dir.empty())
        return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
        throw io_error("xshard: cannot create the directory " + dir.string() + ": " +
                       ec.message());
}

XSHARD_DECL file create_temporary_file(const std::string& path) {
    for (int attempt = 0;; ++attempt) {
        const auto name = path + ".tmp-" + random_suffix();
        const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                              0644);
        if (fd >= 0) {
            auto f = file::adopt(fd, name);
            hold(f);
            return f;
        }
        if (errno != EEXIST || attempt == 16)
            io_fail("cannot create", name);
    }
}

XSHARD_DECL file create_temporary_directory(const std::string& path) {
    std::string name = path + ".tmp-XXXXXX";
    if (!::mkdtemp(name.data()))
        io_fail("cannot create a directory like", name);
    file dir(name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    hold(dir);
    return dir;
}

XSHARD_DECL void write_file_atomically(const std::string& path, std::string_view bytes) {
    create_parent_directories(path);
    auto f = create_temporary_file(path);
    try {
        f.write_at(bytes.data(), bytes.size(), 0);
        f.sync();
        f.close();
        commit_rename(f.path(), path);
    } catch (...) {
        ::unlink(f.path().c_str());
        throw;
    }
}

XSHARD_DECL std::size_t count_entries(const file& dir, std::string_view prefix) {
    const int fd = ::openat(dir.fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* d = fd < 0 ? nullptr : ::fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            ::close(fd);
        io_fail("cannot list", dir.path());
    }
    std::size_t n = 0;
    errno = 0;
    while (const ::dirent* e = ::readdir(d))
        n += std::string_view(e->d_name).starts_with(prefix);
    const int error = errno; // (readdir's end and its failure are both null)
    ::closedir(d);
    if (error != 0) {
        errno = error;
        io_fail("cannot list", dir.path());
    }
    return n;
}

XSHARD_DECL std::string read_file(const file& f, std::size_t limit) {
    if (f.size() > limit)
        throw io_error("xshard: " + f.path() + " is larger than " + std::to_string(limit) +
                       " bytes; not reading it");
    std::string s(f.size(), '\0');
    f.read_at(s.data(), s.size(), 0);
    return s;
}

XSHARD_DECL safetensors_header read_header(const file& f) {
    const std::size_t size = f.size();
    std::string head(std::min<std::size_t>(size, 8), '\0');
    f.read_at(head.data(), head.size(), 0);
    if (head.size() == 8) {
        std::uint64_t length = 0;
        for (int i = 7; i >= 0; --i)
            length = length << 8 | std::uint8_t(head[std::size_t(i)]);
        if (length <= max_header_bytes && length <= size - 8) {
            head.resize(8 + std::size_t(length));
            f.read_at(head.data() + 8, std::size_t(length), 8);
        }
    }
    try {
        return parse_header(head, size);
    } catch (const io_error& e) {
        throw io_error(std::string(e.what()) + " (" + f.path() + ")");
    }
}

XSHARD_DECL std::uint32_t crc_of_range(const file& f, std::size_t at, std::size_t n,
                                       std::vector<std::byte>& buffer, std::uint32_t crc) {
    buffer.resize(std::max(buffer.size(), std::min<std::size_t>(n, std::size_t(16) << 20)));
    for (std::size_t done = 0; done < n;) {
        const auto k = std::min(buffer.size(), n - done);
        f.read_at(buffer.data(), k, at + done);
        crc = crc32_of(buffer.data(), k, crc);
        done += k;
    }
    return crc;
}

XSHARD_DECL std::string crc_hex(std::uint32_t crc) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", crc);
    return text;
}

XSHARD_DECL std::vector<std::optional<std::uint32_t>>
combine_runs(std::vector<crc_run> runs, const std::vector<std::uint64_t>& sizes) {
    std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) {
        return std::tie(a.tensor, a.offset) < std::tie(b.tensor, b.offset);
    });
    std::vector<std::optional<std::uint32_t>> out(sizes.size());
    std::vector<std::uint64_t> covered(sizes.size(), 0);
    std::vector<bool> broken(sizes.size(), false);
    std::vector<std::uint32_t> crc(sizes.size(), 0);
    for (const auto& r : runs) {
        const auto t = std::size_t(r.tensor);
        if (t >= sizes.size() || r.offset != covered[t]) {
            if (t < sizes.size())
                broken[t] = true;
            continue;
        }
        crc[t] = std::uint32_t(::crc32_combine(uLong(crc[t]), uLong(r.crc), z_off_t(r.length)));
        covered[t] += r.length;
    }
    for (std::size_t t = 0; t < sizes.size(); ++t)
        if (!broken[t] && covered[t] == sizes[t])
            out[t] = crc[t];
    return out;
}

XSHARD_DECL std::vector<std::pair<std::size_t, std::size_t>>
runs_of(const std::vector<std::size_t>& shape, const std::vector<std::size_t>& offset,
        const std::vector<std::size_t>& extent, std::size_t element) {
    const std::size_t n = shape.size();
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    const std::size_t size = volume(extent);
    if (size == 0)
        return runs;
    if (n == 0) {
        runs.emplace_back(0, element);
        return runs;
    }
    std::size_t inner = n - 1, run = extent[n - 1];
    while (inner > 0 && extent[inner] == shape[inner]) {
        --inner;
        run *= extent[inner];
    }
    std::vector<std::size_t> stride(n, 1);
    for (std::size_t d = n - 1; d-- > 0;)
        stride[d] = stride[d + 1] * shape[d + 1];
    std::vector<std::size_t> idx(inner, 0);
    for (std::size_t k = 0; k < size / run; ++k) {
        std::size_t at = 0;
        for (std::size_t d = 0; d < n; ++d)
            at += (offset[d] + (d < inner ? idx[d] : 0)) * stride[d];
        runs.emplace_back(at * element, run * element);
        for (std::size_t d = inner; d-- > 0;) {
            if (++idx[d] < extent[d])
                break;
            idx[d] = 0;
        }
    }
    return runs;
}

XSHARD_DECL std::vector<std::array<std::size_t, 3>>
copy_runs(const std::vector<std::size_t>& ro, const std::vector<std::size_t>& re,
          const std::vector<std::size_t>& so, const std::vector<std::size_t>& se,
          const std::vector<std::size_t>& dof, const std::vector<std::size_t>& de,
          std::size_t element) {
    std::vector<std::size_t> rel_src(ro.size()), rel_dst(ro.size());
    for (std::size_t d = 0; d < ro.size(); ++d) {
        rel_src[d] = ro[d] - so[d];
        rel_dst[d] = ro[d] - dof[d];
    }
    const auto src = runs_of(se, rel_src, re, element);
    std::vector<std::array<std::size_t, 3>> out;
    // The destination runs may be shorter (fewer whole dimensions): split source runs to them.
    const auto dst = runs_of(de, rel_dst, re, element);
    std::size_t i = 0, j = 0, si = 0, dj = 0;
    while (i < src.size() && j < dst.size()) {
        const std::size_t n = std::min(src[i].second - si, dst[j].second - dj);
        out.push_back({src[i].first + si, dst[j].first + dj, n});
        si += n;
        dj += n;
        if (si == src[i].second) {
            ++i;
            si = 0;
        }
        if (dj == dst[j].second) {
            ++j;
            dj = 0;
        }
    }
    return out;
}

} // namespace detail

} // namespace xshard

