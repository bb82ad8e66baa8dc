#pragma once
/// \file
/// Checkpoints and files: distributed checkpoints saved sharded and loaded into any strategy,
/// the safetensors format, strategy files, and offline verification and merging (io/).

#include <xshard/io/checkpoint.hpp>
#include <xshard/io/file_mapping.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/format.hpp>
#include <xshard/io/mapped_writer.hpp>
#include <xshard/io/node_io.hpp>
#include <xshard/io/offline.hpp>
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>
