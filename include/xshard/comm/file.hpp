#pragma once
/// \file
/// MPI-IO files: a file opened collectively by the ranks of a communicator, closed with the
/// object. Every call checks its return code and, for transfers, the byte count in its
/// status; a failure is an `io_error` naming the path, the operation and MPI's reason,
/// raised on the ranks that saw it (callers agree on errors after each I/O phase, see
/// comm/agree.hpp). Transfers take a derived datatype and a count of one, so no count is
/// limited to `int` (see comm/subarray.hpp for the datatypes).

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/subarray.hpp>

#include <mpi.h>

#include <cstddef>
#include <string>
#include <utility>

namespace xshard {

class mpi_file {
public:
    enum class mode { read, write };

    mpi_file() = default;

    /// Opens `path` on every rank of `comm` (collective): for reading, or for writing an
    /// existing file (it is never created here: xshard creates files exclusively, with
    /// POSIX calls, before opening them for MPI-IO).
    mpi_file(const communicator& comm, std::string path, mode m)
        : path_(std::move(path)) {
        const int amode = m == mode::read ? MPI_MODE_RDONLY : MPI_MODE_WRONLY;
        check(MPI_File_open(comm.native(), path_.c_str(), amode, MPI_INFO_NULL, &fh_),
              "MPI_File_open");
    }
    mpi_file(mpi_file&& o) noexcept
        : fh_(std::exchange(o.fh_, MPI_FILE_NULL))
        , path_(std::move(o.path_)) {}
    mpi_file& operator=(mpi_file&& o) noexcept {
        std::swap(fh_, o.fh_);
        std::swap(path_, o.path_);
        return *this;
    }
    ~mpi_file() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (fh_ != MPI_FILE_NULL && !finalized)
            MPI_File_close(&fh_);
    }

    const std::string& path() const noexcept { return path_; }

    /// Sets this rank's view: the file seen through `filetype` (bytes as the elementary
    /// type; e.g. placed_datatype of byte_subarray_datatype's). Collective.
    void set_view(const derived_datatype& filetype) { set_view(filetype.native()); }
    /// Sets this rank's view back to every byte of the file. Collective.
    void set_byte_view() { set_view(MPI_BYTE); }

    /// Writes one `buffers` (a datatype of absolute addresses, see buffers_datatype) of
    /// `bytes` bytes in all through the view; the byte count is checked against the status.
    /// Collective; a rank with nothing to write passes bytes = 0.
    void write_all(const derived_datatype& buffers, std::size_t bytes) {
        MPI_Status status;
        check(MPI_File_write_at_all(fh_, 0, MPI_BOTTOM, bytes ? 1 : 0, type_or_byte(buffers, bytes),
                                    &status),
              "MPI_File_write_at_all");
        check_count(status, bytes, "MPI_File_write_at_all");
    }
    /// Reads into `buffers` through the view (see write_all). Collective.
    void read_all(const derived_datatype& buffers, std::size_t bytes) {
        MPI_Status status;
        check(MPI_File_read_at_all(fh_, 0, MPI_BOTTOM, bytes ? 1 : 0, type_or_byte(buffers, bytes),
                                   &status),
              "MPI_File_read_at_all");
        check_count(status, bytes, "MPI_File_read_at_all");
    }
    /// Writes `bytes` bytes at byte `offset` of the view, this rank alone (not collective).
    void write_at(std::size_t offset, const void* data, std::size_t bytes) {
        const auto type = byte_run_datatype(bytes);
        MPI_Status status;
        check(MPI_File_write_at(fh_, detail::to_aint(offset), data, bytes ? 1 : 0, type.native(),
                                &status),
              "MPI_File_write_at");
        check_count(status, bytes, "MPI_File_write_at");
    }

    /// The file's size in bytes.
    std::size_t size() const {
        MPI_Offset n = 0;
        check(MPI_File_get_size(fh_, &n), "MPI_File_get_size");
        return static_cast<std::size_t>(n);
    }
    /// Flushes what this process wrote to the storage device. Collective.
    void sync() { check(MPI_File_sync(fh_), "MPI_File_sync"); }
    /// Closes the file, reporting a failure (the destructor closes silently). Collective.
    void close() { check(MPI_File_close(&fh_), "MPI_File_close"); }

private:
    static MPI_Datatype type_or_byte(const derived_datatype& t, std::size_t bytes) {
        return bytes ? t.native() : MPI_BYTE;
    }
    void set_view(MPI_Datatype filetype) {
        check(MPI_File_set_view(fh_, 0, MPI_BYTE, filetype, "native", MPI_INFO_NULL),
              "MPI_File_set_view");
    }
    void check(int code, const char* operation) const {
        if (code != MPI_SUCCESS)
            throw io_error("xshard: " + std::string(operation) + " " + path_ + " failed on rank " +
                           std::to_string(detail::world_rank()) + ": " +
                           mpi_error::error_string(code));
    }
    void check_count(const MPI_Status& status, std::size_t bytes, const char* operation) const {
        MPI_Count n = 0;
        check(MPI_Get_elements_x(&status, MPI_BYTE, &n), "MPI_Get_elements_x");
        if (bytes && static_cast<std::size_t>(n) != bytes)
            throw io_error("xshard: " + std::string(operation) + " " + path_ + " moved " +
                           std::to_string(n) + " of " + std::to_string(bytes) +
                           " bytes on rank " + std::to_string(detail::world_rank()));
    }

    MPI_File fh_ = MPI_FILE_NULL;
    std::string path_;
};

} // namespace xshard
