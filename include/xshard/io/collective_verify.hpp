#pragma once
/// \file
/// Checking stored bytes against their CRC-32s over the ranks of a communicator, each byte
/// read once by one rank: after a save (check_written: the file read back against the
/// checksums computed from memory) and in a load (verify_shared: every stored block the load
/// reads, checked before anything is read into the model). Each rank's checksum runs go to
/// rank 0, which combines them (gather_runs, files.hpp's combine_runs).

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace xshard::detail {

/// Everyone's checksum runs, on rank 0 of `c`.
XSHARD_DECL std::vector<crc_run> gather_runs(const communicator& c,
                                             const std::vector<crc_run>& mine);

/// The bytes verified at a time: the size of the pieces of a verification, and of the one
/// buffer a load needs beyond the model.
inline constexpr std::size_t verify_chunk = std::size_t(1) << 20;

/// Checks every stored byte of `stored` in `r` against its CRC-32, each read once, by one
/// rank of `c`: each rank a contiguous share of the stored bytes in the order of the files,
/// balanced by bytes, read in that order in large pieces (checkpoint_reader::checksum_share);
/// raises io_error on every rank naming the damaged tensors. Collective.
XSHARD_DECL void verify_shared(const communicator& c, const checkpoint_reader& r,
                               const std::vector<const strategy_entry*>& stored,
                               const std::string& where);

/// Raises io_error on every rank unless every rank's `id` equals rank 0's: the ranks read
/// one and the same file. Collective (a broadcast and an all-reduce).
XSHARD_DECL void check_same_file(const communicator& c, std::array<std::uint64_t, 4> id,
                                 const std::string& path);

/// The post-write check of an integrated save, after every rank wrote its blocks and rank 0
/// the header: the temporary `tmp` read back, each byte once by one rank (a contiguous share
/// of the file per rank, in verify_chunk pieces), and checked against `crcs`, the CRC-32 of
/// each tensor computed from memory; rank 0 also checks the file's size and reads the header
/// back. Meanwhile the file is made durable: each rank has the device write its share (the
/// writing runs while it reads its share back), then rank 0 fsyncs the file (its metadata,
/// the device's cache). A write that failed anywhere (a full disk, a quota, a file-size
/// limit, even one the system did not report) raises io_error on every rank. Collective.
XSHARD_DECL void check_written(const communicator& c, const std::string& tmp,
                               const std::string& path, const std::string& header,
                               const std::vector<tensor_entry>& entries,
                               const std::vector<std::optional<std::uint32_t>>& crcs,
                               std::size_t expected_size);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/collective_verify.ipp>
#endif
