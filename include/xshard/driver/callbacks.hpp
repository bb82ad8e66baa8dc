#pragma once
/// \file
/// The training driver's callbacks (MindSpore's Callback, LossMonitor, ModelCheckpoint): what
/// `trainer::train` (driver/trainer.hpp) tells them at the start of training, after each step
/// and at the end of each epoch, and the two callbacks xshard ships.
///
///     driver.train(2, loader, {xshard::callbacks::loss_monitor(1),
///                              xshard::callbacks::model_checkpoint({.save_checkpoint_steps = 4,
///                                                                   .directory = "ckpt"})});

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
inline callback loss_monitor(std::size_t per_print_times = 1, monitor_output out = stdout,
                             int precision = 6) {
    if (per_print_times == 0)
        throw error("xshard: loss_monitor: per_print_times must be a positive integer, not 0");
    auto monitor = std::make_shared<std::optional<xshard::loss_monitor>>();
    return {.on_train_begin =
                [=](const train_begin_info& t) {
                    monitor->emplace(*t.comm,
                                     loss_monitor_options{.steps_per_epoch = t.steps_per_epoch,
                                                          .epochs = t.epochs,
                                                          .print_every = per_print_times,
                                                          .out = out,
                                                          .precision = precision});
                },
            .on_step = [=](const step_info& s) { (*monitor)->step(s.loss, s.samples); },
            .on_epoch_end =
                [=](std::size_t) {
                    (*monitor)->end_epoch();
                }};
}

/// MindSpore's ModelCheckpoint(prefix, directory, config): saves the parameters and the
/// optimizer's state (an integrated checkpoint, or a per-rank one: `integrated_save`; either
/// loadable into any strategy, mesh or world size with `trainer::load_checkpoint`) after every
/// `save_checkpoint_steps` steps and keeps the newest `keep_checkpoint_max`. A step of 0 or an
/// empty prefix or directory raises (on every rank alike). Each save is collective over the
/// mesh (io/checkpoint.hpp's costs); creating the directory and removing an old checkpoint
/// are agreed (a failure raises everywhere).
inline callback model_checkpoint(checkpoint_config config = {}) {
    if (config.save_checkpoint_steps == 0)
        throw error("xshard: model_checkpoint: save_checkpoint_steps must be a positive "
                    "integer, not 0");
    if (config.prefix.empty() || config.directory.empty())
        throw error("xshard: model_checkpoint: the prefix and the directory must not be empty");
    struct state {
        checkpoint_config config;
        train_begin_info begin{};
        std::deque<std::string> saved{};
    };
    auto s = std::make_shared<state>(state{std::move(config), {}, {}});
    return {.on_train_begin =
                [s](const train_begin_info& t) {
                    s->begin = t;
                    agreed<io_error>(*t.comm, [&] {
                        std::error_code ec;
                        std::filesystem::create_directories(s->config.directory, ec);
                        if (ec)
                            throw io_error("xshard: model_checkpoint: cannot create " +
                                           s->config.directory + " on rank " +
                                           std::to_string(t.comm->rank()) + ": " + ec.message());
                    });
                },
            .on_step =
                [s](const step_info& i) {
                    if (i.global_step % std::int64_t(s->config.save_checkpoint_steps) != 0)
                        return;
                    const bool integrated = s->config.integrated_save;
                    const std::string path = s->config.directory + "/" + s->config.prefix + "-" +
                                             std::to_string(i.epoch + 1) + "_" +
                                             std::to_string(i.global_step) +
                                             (integrated ? ".safetensors" : "");
                    s->begin.save_checkpoint(path, i.global_step,
                                             integrated ? checkpoint_format::integrated
                                                        : checkpoint_format::per_rank);
                    s->saved.push_back(path);
                    if (s->config.keep_checkpoint_max == 0 ||
                        s->saved.size() <= s->config.keep_checkpoint_max)
                        return;
                    const std::string old = s->saved.front();
                    s->saved.pop_front();
                    const auto& comm = *s->begin.comm;
                    agreed<io_error>(comm, [&] {
                        std::error_code ec;
                        if (comm.rank() == 0)
                            std::filesystem::remove_all(old, ec);
                        if (ec)
                            throw io_error("xshard: model_checkpoint: cannot remove " + old + ": " +
                                           ec.message());
                    });
                }};
}

} // namespace callbacks

} // namespace xshard
