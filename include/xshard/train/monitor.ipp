#pragma once
/// \file
/// The definitions of what train/monitor.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/monitor.hpp>

namespace xshard {

XSHARD_DECL void monitor_output::write(std::string_view text) const {
    if (stream_) {
        stream_->write(text.data(), std::streamsize(text.size()));
        stream_->flush();
    } else if (file_) {
        std::fwrite(text.data(), 1, text.size(), file_);
        std::fflush(file_);
    }
}

XSHARD_DECL bool monitor_output::is_terminal() const noexcept {
    if (file_)
        return ::isatty(::fileno(file_)) == 1;
    if (stream_ == &std::cout)
        return ::isatty(1) == 1;
    if (stream_ == &std::cerr || stream_ == &std::clog)
        return ::isatty(2) == 1;
    return false;
}

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

XSHARD_DECL void loss_monitor::step(double loss, std::size_t samples) {
    ++step_;
    ++total_steps_;
    last_loss_ = loss;
    loss_sum_ += loss;
    epoch_samples_ += samples;
    report_samples_ += samples;
    if (!printer_)
        return;
    if (step_ % options_.print_every == 0 || step_ == options_.steps_per_epoch)
        report();
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

XSHARD_DECL std::string loss_monitor::epoch_text() const {
    return "epoch " + std::to_string(epoch_ + 1) +
           (options_.epochs ? "/" + std::to_string(options_.epochs) : "");
}

XSHARD_DECL std::string loss_monitor::number(double x) const {
    char text[64];
    std::snprintf(text, sizeof text, "%.*g", options_.precision, x);
    return text;
}

XSHARD_DECL std::string loss_monitor::fixed(double x, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, x);
    return text;
}

XSHARD_DECL std::string loss_monitor::duration(double seconds) {
    if (seconds < 60)
        return fixed(seconds, 1) + " s";
    const auto s = static_cast<long long>(seconds);
    char text[64];
    if (s < 3600)
        std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
    else
        std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s / 60 % 60);
    return text;
}

} // namespace xshard
