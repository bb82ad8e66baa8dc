#pragma once
/// \file
/// The protocol of every save, in one process or collectively: check what the destination
/// holds (only a checkpoint of xshard's is ever replaced), create the directories above it,
/// remove what killed saves left beside it, write the new checkpoint under a temporary name
/// beside it (a file, or a directory for the per-rank form), held while it is written, then
/// put it in place (atomic_replace.hpp); a save that fails before that removes its temporary.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/files.hpp>

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>

namespace xshard::detail {

/// What a save writes under its temporary name: one file, or a directory of files.
enum class temporary_kind { file, directory };

/// Begins a save to `path`: throws io_error, creating nothing, unless what `path` holds is
/// nothing or a checkpoint of xshard's (replaceable); creates the directories above it,
/// removes the stale temporaries of killed saves beside it, and creates the temporary (a
/// file open for writing, or a directory), held while the returned object keeps it open.
XSHARD_DECL file stage_temporary(const std::string& path, temporary_kind kind);

/// Removes the temporary `tmp` of kind `kind` that a failed save left (for a directory, the
/// checkpoint's files in it, then it). Never throws (it runs while an exception unwinds).
XSHARD_DECL void remove_temporary(const std::string& tmp, temporary_kind kind) noexcept;

/// A save in one process: stage_temporary(path, kind), then `write(tmp)` with the temporary
/// (open, held), which writes it and puts it in place (replace_checkpoint); if anything
/// throws, the temporary is removed and the exception goes on.
template <class Write>
void write_staged(const std::string& path, temporary_kind kind, Write&& write) {
    auto tmp = stage_temporary(path, kind);
    try {
        write(tmp);
    } catch (...) {
        remove_temporary(tmp.path(), kind);
        throw;
    }
}

/// A save over the ranks of `c`: rank 0 begins it (stage_temporary) and holds the temporary
/// until the save ends; every rank learns its name and runs `write(tmp)`, which writes its
/// part (with its failures agreed on, everywhere); then rank 0 runs `commit(tmp)`, which puts
/// it in place. If anything throws before the commit is done, every rank runs
/// `remove_own(tmp)` (what it wrote of the temporary) and rank 0 removes the temporary, and
/// the exception goes on. Collective: rank 0's failures are agreed on (on_rank0), its
/// temporary's name broadcast.
template <class Write, class Commit, class RemoveOwn>
void staged_save(const communicator& c, const std::string& path, temporary_kind kind, Write&& write,
                 Commit&& commit, RemoveOwn&& remove_own) {
    std::optional<std::string> created;
    std::optional<file> held;
    on_rank0(c, [&] {
        held.emplace(stage_temporary(path, kind));
        created = held->path();
    });
    const std::string tmp = message_from(c, 0, created);
    try {
        write(tmp);
        on_rank0(c, [&] { commit(tmp); });
    } catch (...) {
        remove_own(tmp);
        if (c.rank() == 0)
            remove_temporary(tmp, kind);
        throw;
    }
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/staged_save.ipp>
#endif
