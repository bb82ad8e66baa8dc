#pragma once
/// \file
/// The definitions of what train/monitor.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/monitor.hpp>

namespace xshard {

XSHARD_DECL loss_monitor::loss_monitor(const communicator& comm, loss_monitor_options options)
    : options_(std::move(options))
    , printer_(comm.rank() == 0)
    , bar_(options_.progress_bar.value_or(options_.out.is_terminal() &&
                                          !detail::under_mpi_launcher()))
    , start_(clock::now())
    , epoch_start_(start_)
    , last_report_(start_) {
    if (options_.print_every == 0)
        throw error("xshard: loss_monitor: print_every is 0");
    if (options_.precision < 1 || options_.precision > 17)
        throw error("xshard: loss_monitor: precision " + std::to_string(options_.precision) +
                    " is not in 1..17");
}

XSHARD_DECL void loss_monitor::end_epoch() {
    if (printer_) {
        const auto now = clock::now();
        const double seconds = std::chrono::duration<double>(now - epoch_start_).count();
        std::string line = (bar_ ? "\n" : "") + epoch_text() +
                           " done: " + std::to_string(step_) + " steps, mean loss " +
                           number(epoch_mean_loss());
        if (epoch_samples_ > 0 && seconds > 0)
            line += ", " + fixed(double(epoch_samples_) / seconds, 1) + " samples/s";
        line += ", elapsed " + duration(std::chrono::duration<double>(now - start_).count());
        options_.out.write(line + "\n");
        epoch_start_ = last_report_ = now;
    }
    ++epoch_;
    step_ = 0;
    loss_sum_ = 0;
    epoch_samples_ = report_samples_ = 0;
}

XSHARD_DECL void loss_monitor::report() {
    const auto now = clock::now();
    const double since = std::chrono::duration<double>(now - last_report_).count();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    std::string line = epoch_text();
    const auto spe = options_.steps_per_epoch;
    if (bar_ && spe > 0) {
        const auto filled = std::min(options_.bar_width, options_.bar_width * step_ / spe);
        line += " [" + std::string(filled, '#') +
                std::string(options_.bar_width - filled, '.') + "] " + std::to_string(step_) +
                "/" + std::to_string(spe);
    } else {
        line += " step " + std::to_string(step_) + (spe ? "/" + std::to_string(spe) : "");
    }
    line += " loss " + number(last_loss_);
    if (report_samples_ > 0 && since > 0)
        line += " " + fixed(double(report_samples_) / since, 1) + " samples/s";
    line += " elapsed " + duration(elapsed);
    if (const auto total = spe * options_.epochs; total > 0) {
        const auto left = total > total_steps_ ? total - total_steps_ : 0;
        line += " eta " + duration(elapsed / double(total_steps_) * double(left));
    }
    options_.out.write(bar_ ? "\r" + line + "\x1b[K" : line + "\n");
    last_report_ = now;
    report_samples_ = 0;
}

} // namespace xshard
