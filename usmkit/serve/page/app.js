// The page: microphone -> AudioWorklet (resampling to 16 kHz, 16-bit PCM) -> WebSocket -> results.
//
// Protocol (usmkit/serve/protocol.py, WeNet's): {"signal": "start", ...}, binary PCM, {"signal": "end"};
// the server answers server_ready, partial_result / final_result (nbest: a JSON string of a list),
// speech_end, or {"status": "failed", "message"}. `window.usmkit` holds the page's state (phase,
// finals, partial, error) for the console and for tests.

const TARGET_RATE = 16000;
const $ = (id) => document.getElementById(id);
const state = { phase: "idle", finals: [], partial: "", partials: 0, error: null, inputRate: null, samplesSent: 0 };
window.usmkit = state;

let ws = null;
let audio = null; // { context, media, node }
let serverReady = null; // resolves on server_ready

function defaultUrl() {
  const token = new URLSearchParams(location.search).get("token");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/` + (token ? `?token=${encodeURIComponent(token)}` : "");
}

function formatTime(ms) {
  const s = ms / 1000;
  const minutes = Math.floor(s / 60);
  return `${String(minutes).padStart(2, "0")}:${(s - 60 * minutes).toFixed(2).padStart(5, "0")}`;
}

function setPhase(phase, message) {
  state.phase = phase;
  $("start").disabled = !["idle", "done", "error"].includes(phase);
  $("stop").disabled = phase !== "streaming";
  const status = $("status");
  status.classList.toggle("error", phase === "error");
  status.textContent = message ?? {
    connecting: "connecting...",
    streaming: `streaming: microphone at ${state.inputRate} Hz, resampled to ${TARGET_RATE} Hz in the page`,
    finishing: "finishing: waiting for the last results",
    done: `done: ${state.finals.length} segment(s), ${(state.samplesSent / TARGET_RATE).toFixed(2)} s of audio sent`,
  }[phase] ?? phase;
}

function fail(message) {
  state.error = message;
  setPhase("error", `error: ${message}`);
  closeAudio();
  if (ws && ws.readyState <= WebSocket.OPEN) ws.close();
}

function render() {
  $("partial").textContent = state.partial;
  const list = $("finals");
  while (list.children.length < state.finals.length) {
    const final = state.finals[list.children.length];
    const words = final.word_pieces;
    const item = document.createElement("li");
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = words.length
      ? `[${formatTime(words[0].start)} - ${formatTime(words[words.length - 1].end)}]`
      : "";
    item.append(time);
    for (const w of words) {
      const word = document.createElement("span");
      word.className = "word";
      word.title = `${(w.start / 1000).toFixed(2)} - ${(w.end / 1000).toFixed(2)} s`;
      const small = document.createElement("small");
      small.textContent = (w.start / 1000).toFixed(2);
      word.append(w.word, small);
      item.append(word);
    }
    if (!words.length) item.append(final.sentence);
    list.append(item);
  }
}

function onMessage(event) {
  const message = JSON.parse(event.data);
  if (message.status !== "ok") return fail(message.message ?? "the server failed");
  if (message.type === "server_ready") serverReady.resolve();
  else if (message.type === "partial_result") {
    state.partial = JSON.parse(message.nbest)[0].sentence;
    state.partials++;
  } else if (message.type === "final_result") {
    const best = JSON.parse(message.nbest)[0];
    if (best.sentence) state.finals.push(best);
    state.partial = "";
  } else if (message.type === "speech_end") {
    setPhase("done");
    ws.close();
    closeAudio();
  }
  render();
}

function openSocket(url) {
  return new Promise((resolve, reject) => {
    ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => resolve();
    ws.onerror = () => reject(new Error(`cannot connect to ${url}`));
    ws.onmessage = onMessage;
    ws.onclose = (event) => {
      if (!["done", "error"].includes(state.phase)) {
        fail(`the connection closed (code ${event.code}${event.reason ? ", " + event.reason : ""})`);
      }
    };
  });
}

async function openMicrophone() {
  // The recognizer wants the raw signal: no echo cancellation, noise suppression or gain control.
  const media = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
  });
  const context = new AudioContext();
  await context.resume();
  await context.audioWorklet.addModule("pcm-worklet.js");
  const node = new AudioWorkletNode(context, "pcm-16k", { processorOptions: { targetRate: TARGET_RATE } });
  node.port.onmessage = (event) => {
    if (event.data.pcm) {
      if (ws.readyState !== WebSocket.OPEN) return;
      ws.send(event.data.pcm);
      state.samplesSent += event.data.pcm.byteLength / 2;
      $("level").value = event.data.peak;
    } else if (event.data.flushed) {
      ws.send(JSON.stringify({ signal: "end" }));
      closeAudio();
    }
  };
  context.createMediaStreamSource(media).connect(node);
  node.connect(context.destination); // the processor outputs silence; connected so that it keeps running
  state.inputRate = context.sampleRate;
  return { context, media, node };
}

function closeAudio() {
  if (!audio) return;
  audio.media.getTracks().forEach((track) => track.stop());
  audio.context.close();
  audio = null;
}

async function start() {
  state.finals = [];
  state.partial = "";
  state.error = null;
  state.samplesSent = 0;
  state.partials = 0;
  $("finals").replaceChildren();
  render();
  setPhase("connecting");
  try {
    await openSocket($("url").value);
    const ready = new Promise((resolve) => (serverReady = { resolve }));
    ws.send(JSON.stringify({ signal: "start", nbest: 1, continuous_decoding: true }));
    await ready;
    audio = await openMicrophone();
    setPhase("streaming");
  } catch (error) {
    fail(error.message || String(error));
  }
}

function stop() {
  if (!audio) return;
  setPhase("finishing");
  audio.node.port.postMessage({ command: "flush" }); // the worklet sends the rest, then the end signal goes
}

$("url").value = defaultUrl();
$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
