#pragma once
/// \file
/// A progress reporter for training loops, after MindSpore's LossMonitor: every few steps
/// rank 0 prints the epoch, the step, the loss, the throughput, the elapsed time and an
/// estimate of the time left:
///
///     epoch 1/3 step 20/100 loss 0.693147 123.4 samples/s elapsed 1.2 s eta 4.8 s
///
/// On a terminal the line is a progress bar rewritten in place (carriage return); into a
/// file or a pipe every report is a line of its own. Under an MPI launcher the bar is off
/// unless asked for (`.progress_bar = true`): Open MPI gives its ranks a pseudo-terminal
/// even when mpirun's own output goes to a file, so isatty cannot tell. The other ranks print
/// nothing and the monitor never communicates: give it the loss every rank agrees on (e.g. after
/// the gradient all-reduce) and the number of samples of the whole step.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace xshard {

namespace detail {

/// Whether an MPI launcher (Open MPI's mpirun, a PMI or PMIx launcher) started the process.
inline bool under_mpi_launcher() noexcept {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
           std::getenv("PMI_RANK");
}

} // namespace detail

/// Where a loss_monitor writes: a C stream (`stdout`, a `tmpfile()`) or a std::ostream.
class monitor_output {
public:
    monitor_output(std::FILE* file) noexcept
        : file_(file) {}
    monitor_output(std::ostream& stream) noexcept
        : stream_(&stream) {}

    /// Writes `text` and flushes.
    void write(std::string_view text) const;

    /// Whether the output is a terminal (std::cout, std::cerr and std::clog are the
    /// terminal of their file descriptor; other streams are not).
    bool is_terminal() const noexcept;

private:
    std::FILE* file_ = nullptr;
    std::ostream* stream_ = nullptr;
};

/// What a loss_monitor prints and where.
struct loss_monitor_options {
    /// Steps in an epoch; 0 when unknown (no totals, bar or estimate then).
    std::size_t steps_per_epoch = 0;
    /// Epochs of the run; 0 when unknown.
    std::size_t epochs = 0;
    /// Report every this many steps (and always at the last step of an epoch).
    std::size_t print_every = 1;
    /// The output, on rank 0.
    monitor_output out = stdout;
    /// Significant digits of the losses (printf's %.Ng).
    int precision = 6;
    /// A progress bar rewritten in place; default: when `out` is a terminal and no MPI
    /// launcher started the process (see the file comment).
    std::optional<bool> progress_bar{};
    /// Characters of the bar.
    std::size_t bar_width = 30;
};

/// Reports training progress on rank 0 of a communicator or mesh (see the file comment).
/// Call `step` after every step and `end_epoch` after every epoch. No communication.
class loss_monitor {
    using clock = std::chrono::steady_clock;

public:
    /// A monitor that prints on rank 0 of `comm`; the clock starts now.
    explicit loss_monitor(const communicator& comm, loss_monitor_options options = {});

    /// A monitor that prints on rank 0 of `mesh`.
    template <mesh_type Mesh>
    explicit loss_monitor(const Mesh& mesh, loss_monitor_options options = {})
        : loss_monitor(mesh.comm(), std::move(options)) {}

    /// Records a step of loss `loss` over `samples` samples (all ranks together; 0 if not
    /// counted: no throughput then) and reports it when due.
    void step(double loss, std::size_t samples = 0);

    /// Ends the epoch: prints its summary (steps, mean loss, throughput) and starts the next.
    void end_epoch();

    /// The epoch in progress, from 0.
    std::size_t epoch() const noexcept { return epoch_; }
    /// Steps recorded in this epoch.
    std::size_t step_in_epoch() const noexcept { return step_; }
    /// The loss of the last step.
    double last_loss() const noexcept { return last_loss_; }
    /// The mean loss of this epoch's steps so far (0 before the first).
    double epoch_mean_loss() const noexcept { return step_ ? loss_sum_ / double(step_) : 0.0; }

private:
    void report();

    std::string epoch_text() const;

    std::string number(double x) const;

    static std::string fixed(double x, int decimals);

    /// "4.8 s", "3m07s", "2h05m".
    static std::string duration(double seconds);

    loss_monitor_options options_;
    bool printer_;
    bool bar_;
    clock::time_point start_, epoch_start_, last_report_;
    std::size_t epoch_ = 0, step_ = 0, total_steps_ = 0;
    std::size_t epoch_samples_ = 0, report_samples_ = 0;
    double last_loss_ = 0, loss_sum_ = 0;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/monitor.ipp>
#endif
