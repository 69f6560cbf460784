//! The boundary between the pipeline and an inference runtime: [`Session`], the tensors it takes
//! and returns ([`Tensor`]), and what a graph declares ([`TensorInfo`]).
//!
//! The stages ([`crate::stages`]) drive a graph only through this trait, so they run natively
//! against a fake session in tests and in the browser against ONNX Runtime Web (the web crate's
//! stage worker implements it). Tensors here are plain CPU buffers: converting to and from the
//! runtime's own tensors is the implementation's job.

use half::f16;
use thiserror::Error;

/// Element type of a tensor, as ONNX names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DType {
    /// `float32`.
    Float32,
    /// `float16`.
    Float16,
    /// `int64`.
    Int64,
    /// Any type the pipeline does not use, by its ONNX name.
    Other(String),
}

impl DType {
    /// The type called `name` (ONNX Runtime's names; any other is [`DType::Other`]).
    pub fn from_name(name: &str) -> Self {
        match name {
            "float32" => DType::Float32,
            "float16" => DType::Float16,
            "int64" => DType::Int64,
            other => DType::Other(other.to_owned()),
        }
    }

    /// The ONNX name (`float32`, `float16`, `int64`, …).
    pub fn name(&self) -> &str {
        match self {
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::Int64 => "int64",
            DType::Other(name) => name,
        }
    }
}

/// One dimension of a declared shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A named size set at run time (`batch`, `sequence`, …).
    Symbolic(String),
}

/// A graph input or output as the graph declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape; empty when the graph declares none.
    pub shape: Vec<Dim>,
}

/// The values of a [`Tensor`].
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// `float32`.
    Float32(Vec<f32>),
    /// `float16`.
    Float16(Vec<f16>),
    /// `int64`.
    Int64(Vec<i64>),
}

/// A CPU tensor: row-major values and their shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The shape.
    pub dims: Vec<i64>,
    /// The values; as many as the product of `dims`.
    pub data: TensorData,
}

/// The float type a graph takes: the pipeline computes in f32 and converts at the graph's edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatType {
    /// `float32`.
    Float32,
    /// `float16`.
    Float16,
}

impl Tensor {
    /// `values` in `float`: copied as they are, or rounded to f16 (nearest even, as
    /// [`to_f16`](crate::latents::to_f16)).
    pub fn from_f32(float: FloatType, values: &[f32], dims: &[i64]) -> Tensor {
        let data = match float {
            FloatType::Float32 => TensorData::Float32(values.to_vec()),
            FloatType::Float16 => TensorData::Float16(crate::latents::to_f16(values)),
        };
        Tensor { dims: dims.to_vec(), data }
    }

    /// An `int64` tensor.
    pub fn from_i64(values: Vec<i64>, dims: &[i64]) -> Tensor {
        Tensor { dims: dims.to_vec(), data: TensorData::Int64(values) }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::Float32(_) => DType::Float32,
            TensorData::Float16(_) => DType::Float16,
            TensorData::Int64(_) => DType::Int64,
        }
    }

    /// The values as f32 (f16 widened exactly); `None` for an integer tensor.
    pub fn into_f32(self) -> Option<Vec<f32>> {
        match self.data {
            TensorData::Float32(values) => Some(values),
            TensorData::Float16(values) => Some(crate::latents::from_f16(&values)),
            TensorData::Int64(_) => None,
        }
    }
}

/// Why a session could not run, in the runtime's own words.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct SessionError(pub String);

/// A loaded graph that can be run. The stages check [`inputs`](Self::inputs) and
/// [`outputs`](Self::outputs) against the pack contract before the first [`run`](Self::run).
// `async fn` in a public trait cannot promise `Send` futures; none is needed: the stages run on one
// thread (a wasm worker, a test).
#[allow(async_fn_in_trait)]
pub trait Session {
    /// The inputs the graph declares.
    fn inputs(&self) -> &[TensorInfo];

    /// The outputs the graph declares.
    fn outputs(&self) -> &[TensorInfo];

    /// Runs the graph on `feeds` (input name, tensor) and returns the outputs named in `fetches`,
    /// in that order.
    async fn run(&mut self, feeds: &[(&str, &Tensor)], fetches: &[&str])
        -> Result<Vec<Tensor>, SessionError>;
}
