#pragma once
/// \file
/// Checkpoints and files: distributed checkpoints saved sharded and loaded into any strategy,
/// the safetensors format, strategy, operator-strategy and communication-group files, offline
/// verification and merging (io/), and a pipeline's checkpoints (pipeline/checkpoint.hpp).

#include <xshard/io/atomic_replace.hpp>
#include <xshard/io/checkpoint.hpp>
#include <xshard/io/checkpoint_forms.hpp>
#include <xshard/io/checkpoint_load.hpp>
#include <xshard/io/checkpoint_model.hpp>
#include <xshard/io/checkpoint_reader.hpp>
#include <xshard/io/checkpoint_save.hpp>
#include <xshard/io/collective_verify.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/group_file.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/offline.hpp>
#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/staged_save.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/pipeline/checkpoint.hpp>
