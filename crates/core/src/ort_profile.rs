//! ONNX Runtime's profile of a session, summed up for a stage's timings.
//!
//! With `enableProfiling`, ONNX Runtime Web records Chrome trace events and writes them out as a JSON
//! array when the profile ends: `Session` events (`model_loading_*`, `session_initialization`,
//! `model_run`), `Node` events (each kernel's CPU side) and, on WebGPU, `Api` events: each dispatch's
//! GPU time from timestamp queries, named `node&OpType&Program`. Durations and starts are in
//! microseconds. [`summarize`] turns that into what a benchmark prints: where session creation went, the
//! GPU time of each run against its wall time, and the GPU time of each operator and program.

use serde::{Deserialize, Serialize};

/// One stage's profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageProfile {
    /// ONNX Runtime's `model_loading_*`: the graph parsed.
    pub model_loading_ms: f64,
    /// ONNX Runtime's `session_initialization`: graph optimization, kernels, the weights read and
    /// uploaded.
    pub session_initialization_ms: f64,
    /// Each run in order: ONNX Runtime's `model_run` and the GPU time of the dispatches in it.
    pub runs: Vec<RunProfile>,
    /// GPU time by operator and program over all runs, the longest first.
    pub kernels: Vec<KernelTime>,
}

/// One run of a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunProfile {
    /// ONNX Runtime's `model_run`.
    pub wall_ms: f64,
    /// Summed over its dispatches (0 without timestamp queries).
    pub gpu_ms: f64,
}

/// The GPU time of one operator's program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelTime {
    /// The ONNX operator, e.g. `MatMulNBits`.
    pub op: String,
    /// ONNX Runtime's shader program for it, e.g. `MatMulNBitsWideTile`.
    pub program: String,
    /// How many times it ran.
    pub dispatches: u32,
    /// GPU time, all dispatches together.
    pub ms: f64,
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    dur: f64,
}

/// The profile in `trace` (ONNX Runtime's JSON array of trace events).
pub fn summarize(trace: &str) -> Result<StageProfile, serde_json::Error> {
    let events: Vec<Event> = serde_json::from_str(trace)?;
    let ms = |us: f64| us / 1000.0;
    let mut profile = StageProfile::default();
    let mut run_starts = Vec::new();
    for e in events.iter().filter(|e| e.cat == "Session") {
        match e.name.as_str() {
            "session_initialization" => profile.session_initialization_ms += ms(e.dur),
            name if name.starts_with("model_loading") => profile.model_loading_ms += ms(e.dur),
            "model_run" => {
                run_starts.push(e.ts);
                profile.runs.push(RunProfile { wall_ms: ms(e.dur), gpu_ms: 0.0 });
            }
            _ => {}
        }
    }
    let mut kernels: Vec<KernelTime> = Vec::new();
    for e in events.iter().filter(|e| e.cat == "Api") {
        // `node&OpType&Program`; a node's name may itself hold `&`.
        let mut parts = e.name.rsplitn(3, '&');
        let (program, op) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        match kernels.iter_mut().find(|k| k.op == op && k.program == program) {
            Some(k) => {
                k.dispatches += 1;
                k.ms += ms(e.dur);
            }
            None => kernels.push(KernelTime {
                op: op.into(),
                program: program.into(),
                dispatches: 1,
                ms: ms(e.dur),
            }),
        }
        // The run it belongs to: the last one started before it.
        if let Some(run) = run_starts.iter().rposition(|&start| start <= e.ts) {
            profile.runs[run].gpu_ms += ms(e.dur);
        }
    }
    kernels.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    profile.kernels = kernels;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events as ONNX Runtime Web 1.30 wrote them for one `MatMulNBits` run twice (SwiftShader), with a
    /// node whose name holds `&` added.
    const TRACE: &str = r#"[
{"cat" : "Session","pid" :42,"tid" :1,"dur" :7699,"ts" :199,"ph" : "X","name" :"model_loading_array","args" : {}},
{"cat" : "Session","pid" :42,"tid" :1,"dur" :116199,"ts" :111200,"ph" : "X","name" :"session_initialization","args" : {}},
{"cat" : "Node","pid" :42,"tid" :1,"dur" :9699,"ts" :234899,"ph" : "X","name" :"MatMulNBits_0_kernel_time","args" : {"op_name" : "MatMulNBits"}},
{"cat" : "Session","pid" :42,"tid" :1,"dur" :170099,"ts" :231699,"ph" : "X","name" :"model_run","args" : {}},
{"cat" : "Session","pid" :42,"tid" :1,"dur" :8100,"ts" :402799,"ph" : "X","name" :"model_run","args" : {}},
{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :9790,"ts" :387899,"ph" : "X","name" :"&MatMulNBits&MatMulNBitsWideTile","args" : {}},
{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :6239,"ts" :403399,"ph" : "X","name" :"&MatMulNBits&MatMulNBitsWideTile","args" : {}},
{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :20000,"ts" :403500,"ph" : "X","name" :"a&b&Add&BinaryElementwise","args" : {}}
]"#;

    #[test]
    fn a_trace_sums_up_to_creation_runs_and_kernels() {
        let p = summarize(TRACE).unwrap();
        assert_eq!((p.model_loading_ms, p.session_initialization_ms), (7.699, 116.199));
        assert_eq!(p.runs.len(), 2);
        assert_eq!((p.runs[0].wall_ms, p.runs[1].wall_ms), (170.099, 8.1));
        assert!(
            (p.runs[0].gpu_ms - 9.79).abs() < 1e-9 && (p.runs[1].gpu_ms - 26.239).abs() < 1e-9,
            "{:?}",
            p.runs
        );
        let kernels: Vec<_> =
            p.kernels.iter().map(|k| (k.op.as_str(), k.program.as_str(), k.dispatches)).collect();
        assert_eq!(kernels, [("Add", "BinaryElementwise", 1), ("MatMulNBits", "MatMulNBitsWideTile", 2)]);
        assert!((p.kernels[1].ms - 16.029).abs() < 1e-9);
    }

    #[test]
    fn what_is_not_a_trace_is_an_error() {
        assert!(summarize("profiling is not supported").is_err());
        assert_eq!(summarize("[]").unwrap(), StageProfile::default());
    }
}
