#pragma once
/// \file
/// The on-disk side of checkpoints, everything a process needs to write or read either form
/// without the collective saves and loads (checkpoint.hpp):
///  * stored_blocks.hpp: the two forms, the files of a per-rank directory, and which blocks
///    of each tensor a checkpoint stores;
///  * checkpoint_forms.hpp: what the forms' headers hold, and the writing of their files;
///  * atomic_replace.hpp: replacing a checkpoint without ever being left with none, and
///    removing what killed saves left;
///  * staged_save.hpp: the protocol of every save (a temporary beside the destination,
///    written, then put in place);
///  * checkpoint_reader.hpp: `checkpoint_reader`, which reads either form in one process.

#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/checkpoint_forms.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/staged_save.hpp>
#include <xshard/io/stored_blocks.hpp>
