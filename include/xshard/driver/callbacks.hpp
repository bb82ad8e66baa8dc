#pragma once
/// \file
/// The training driver's callbacks (MindSpore's Callback, LossMonitor, ModelCheckpoint): what
/// `trainer::train` (driver/trainer.hpp) tells them at the start of training, after each step
/// and at the end of each epoch, and the two callbacks xshard ships.
///
///     driver.train(2, loader, {xshard::callbacks::loss_monitor(1),
///                              xshard::callbacks::model_checkpoint({.save_checkpoint_steps = 4,
///                                                                   .directory = "ckpt"})});

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/io/stored_blocks.hpp>
#include <xshard/train/monitor.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

namespace xshard {

/// Saves the parameters and the optimizer's state as a checkpoint at `path` (io/checkpoint.hpp)
/// with step `step`, integrated (one file) unless `format` says per_rank (a directory).
/// Collective over the mesh.
struct checkpoint_saver {
    std::function<void(const std::string& path, std::int64_t step, checkpoint_format format)> save =
        {};

    void operator()(const std::string& path, std::int64_t step,
                    checkpoint_format format = checkpoint_format::integrated) const {
        save(path, step, format);
    }
};

/// What the driver tells its callbacks at the start of training.
struct train_begin_info {
    const communicator* comm;              ///< the mesh's communicator
    std::size_t epochs;                    ///< epochs of the run
    std::size_t steps_per_epoch;           ///< 0 when the dataset's epochs are not sized
    checkpoint_saver save_checkpoint = {}; ///< the trainer's save_checkpoint
};

/// What the driver tells its callbacks after each step.
struct step_info {
    std::size_t epoch;            ///< from 0
    std::size_t step;             ///< in the epoch, from 0
    double loss;                  ///< the step's loss (the same on every rank)
    std::size_t samples;          ///< the global batch's samples (0 when unknown)
    std::int64_t global_step = 0; ///< steps trained so far, this one included
};

/// A training callback (MindSpore's Callback): any of the three may be empty.
struct callback {
    std::function<void(const train_begin_info&)> on_train_begin = {};
    std::function<void(const step_info&)> on_step = {};
    std::function<void(std::size_t epoch)> on_epoch_end = {};
};

/// MindSpore's CheckpointConfig with ModelCheckpoint's prefix and directory.
struct checkpoint_config {
    /// Save after every this many steps (counted over the whole training, resumed included).
    std::size_t save_checkpoint_steps = 1;
    /// Keep the newest this many checkpoints of this run, removing older ones; 0 keeps all.
    std::size_t keep_checkpoint_max = 5;
    /// Files are `<directory>/<prefix>-<epoch>_<step>.safetensors` (epoch from 1, step the
    /// global step), as MindSpore's `<prefix>-<epoch>_<step>.ckpt`.
    std::string prefix = "checkpoint";
    std::string directory = ".";
    /// MindSpore's integrated_save. False: each checkpoint is a per-rank directory
    /// `<directory>/<prefix>-<epoch>_<step>` (a file of each rank's blocks and the strategy,
    /// io/checkpoint.hpp), loadable like the integrated file into any strategy. A pipeline
    /// saves integrated files only (a per-rank checkpoint raises at the first save).
    bool integrated_save = true;
};

namespace callbacks {

/// MindSpore's LossMonitor(per_print_times): a `loss_monitor` (train/monitor.hpp) reporting
/// every `per_print_times` steps on rank 0 to `out` with `precision` significant digits (0
/// raises, on every rank alike). No communication.
XSHARD_DECL callback loss_monitor(std::size_t per_print_times = 1, monitor_output out = stdout,
                                  int precision = 6);

/// MindSpore's ModelCheckpoint(prefix, directory, config): saves the parameters and the
/// optimizer's state (an integrated checkpoint, or a per-rank one: `integrated_save`; either
/// loadable into any strategy, mesh or world size with `trainer::load_checkpoint`) after every
/// `save_checkpoint_steps` steps and keeps the newest `keep_checkpoint_max`. A step of 0 or an
/// empty prefix or directory raises (on every rank alike). Each save is collective over the
/// mesh (io/checkpoint.hpp's costs); creating the directory and removing an old checkpoint
/// are agreed (a failure raises everywhere).
XSHARD_DECL callback model_checkpoint(checkpoint_config config = {});

} // namespace callbacks

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/driver/callbacks.ipp>
#endif
